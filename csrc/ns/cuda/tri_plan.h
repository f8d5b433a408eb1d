// dmuon/ns/cuda/tri_plan.h — the portable symmetric products' plans (host and device code, no
// CUDA headers, so that they are unit-tested on the CPU: tests/cpp/test_tri_plan.cpp).
//
// Two portable products (any CUDA GPU) compute the lower triangle of D = α·A·Bᵀ + β·C through
// the vendor GEMM, then mirror it onto the upper one.
//
// Row panels ("tri:<block>"), one GEMM per panel of `block` rows:
//   panel p: D[r0 : r0+rows, 0 : r0+rows] = α·A[r0 : r0+rows]·B[0 : r0+rows]ᵀ + β·C[same],
// r0 = p·block, so panel p also covers the diagonal block (p, p) whole; then the mirror
// copies the lower triangle onto the upper one. With k = ceil(m / block) panels of equal
// height the GEMMs perform (k + 1) / (2k) of the dense product's FLOPs.
// NOTE: row panels (one GEMM per panel, batched over the matrices with their own strides)
// rather than the k(k+1)/2 blocks: k launches however large the batch, each a GEMM at
// least block × block × K, so the library's tiles stay full.
//
// Lower blocks ("blk:<block>"): with F = floor(m / block) full block rows, the F(F+1)/2 lower
// block × block blocks (i, j ≤ i) of every matrix of the batch in ONE pointer-array GEMM
// (block index t = i(i+1)/2 + j; its pointers written on the device), then the remainder rows
// [F·block, m) as one row panel over all m columns. Work: (F(F+1)/2·block² + rest·m) / m².
// NOTE: the row panels measured 0.64–1.16× of dense cuBLAS's time for m ≥ 1024 on an H100 (their
// GEMMs run one after another, the first ones small); the blocks are one launch of
// batch × F(F+1)/2 equal GEMMs.
//
// The mirror's grid enumerates only the upper tiles (tile row ≤ tile column) of a T×T
// tiling, column by column: tile (tr, tc) has index tc(tc+1)/2 + tr.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#define DMUON_TRI_HD __host__ __device__ __forceinline__
#else
#define DMUON_TRI_HD inline
#endif

namespace dmuon::ns::cuda {

/// One GEMM of the plan: rows [row0, row0 + rows) of D, columns [0, cols) (cols = row0 + rows).
struct TriPanel {
  int64_t row0 = 0, rows = 0, cols = 0;
};

/// Block heights are multiples of this many rows.
/// NOTE: a panel's A, C and D start row0·ld elements into their matrix; with row0 a multiple
/// of 128 that offset is a multiple of 256 bytes for 16-bit elements (any ld), the alignment
/// cuBLASLt's heuristic assumes of every operand by default.
inline constexpr int64_t kTriBlockQuantum = 128;

/// The panels of an m×m product with `block`-row panels (block a positive multiple of
/// kTriBlockQuantum; block ≥ m: one panel, the dense product).
std::vector<TriPanel> tri_panels(int64_t m, int64_t block);

/// "tri:<block>".
std::string tri_name(int64_t block);

/// The block of a name "tri:<block>" (a positive multiple of kTriBlockQuantum); −1 for any
/// other name.
int64_t parse_tri(const std::string& config);

/// The blocks the autotuner tries for m×m products: ceil(m / k) rounded up to the quantum for
/// k = 2, 3, 4, 6, 8, 12, 16 panels, distinct, below m; empty when m < 2·kTriBlockQuantum.
std::vector<int64_t> tri_block_candidates(int64_t m);

/// The block an untuned run uses: four panels (5/8 of the dense FLOPs); m itself (one panel)
/// when m < 2·kTriBlockQuantum.
int64_t tri_default_block(int64_t m);

/// The lower-block product's plan of an m×m product (block: a positive multiple of
/// kTriBlockQuantum; block > m: no blocks, the remainder panel is the dense product).
struct BlockPlan {
  int64_t block = 0;
  int64_t num_block_rows = 0;  ///< F = floor(m / block)
  int64_t num_blocks = 0;      ///< F(F+1)/2 lower blocks per matrix
  TriPanel remainder;          ///< rows [F·block, m), columns [0, m); rows == 0 when block divides m
};
BlockPlan block_plan(int64_t m, int64_t block);

/// "blk:<block>".
std::string blk_name(int64_t block);

/// The block of a name "blk:<block>" (a positive multiple of kTriBlockQuantum); −1 for any
/// other name.
int64_t parse_blk(const std::string& config);

/// The blocks the autotuner tries for m×m lower-block products: 128, 256, 384 and 512 where
/// there are at least two block rows (2·block ≤ m); empty when m < 2·kTriBlockQuantum.
std::vector<int64_t> blk_block_candidates(int64_t m);

/// The block an untuned lower-block product uses (forced alone, DMUON_AUTOTUNE=0): 256 where
/// m ≥ 512, else 128. NOTE: not measured; the tuner measures every candidate wherever it runs.
int64_t blk_default_block(int64_t m);

/// The largest power of two (at most 256) dividing every one of `byte_offsets` (zeros
/// ignored): the alignment cuBLASLt may assume of pointers it cannot see (pointer arrays).
int64_t common_alignment(const std::vector<uint64_t>& byte_offsets);

/// Operand layouts of one symmetric product (elements; SymProductArgs' fields).
struct BlockStrides {
  int64_t block, num_blocks, lda, stride_a, ldb, stride_b, ldc, stride_c, ldd, stride_d;
};

/// Element offsets of the A rows, B rows, C block and D block of pointer `index` (over
/// batch × num_blocks: matrix index / num_blocks, lower block index % num_blocks).
struct BlockOffsets {
  int64_t a, b, c, d;
};

/// Number of upper tiles (tr ≤ tc) of a T×T tiling.
DMUON_TRI_HD int64_t num_upper_tiles(int64_t tiles) { return tiles * (tiles + 1) / 2; }

/// The upper tile (tr ≤ tc) of a column-by-column index (tile (tr, tc) ↔ tc(tc+1)/2 + tr).
DMUON_TRI_HD void upper_tile(int64_t index, int64_t* tr, int64_t* tc) {
  // NOTE: the square root's estimate is corrected by integer steps (exact for any index
  // whose double is within a tile column of the truth, i.e. far beyond 2^40 tiles).
  int64_t c = static_cast<int64_t>((sqrt(8.0 * static_cast<double>(index) + 1.0) - 1.0) / 2.0);
  while (c * (c + 1) / 2 > index) --c;
  while ((c + 1) * (c + 2) / 2 <= index) ++c;
  *tc = c;
  *tr = index - c * (c + 1) / 2;
}

/// The offsets of pointer `index` of a lower-block product (see BlockOffsets).
DMUON_TRI_HD BlockOffsets block_offsets(const BlockStrides& s, int64_t index) {
  const int64_t matrix = index / s.num_blocks;
  int64_t row = 0, col = 0;
  upper_tile(index % s.num_blocks, &col, &row);  // NOTE: lower block (row, col) = upper tile (col, row)
  const int64_t r0 = row * s.block, c0 = col * s.block;
  return {matrix * s.stride_a + r0 * s.lda, matrix * s.stride_b + c0 * s.ldb,
          matrix * s.stride_c + r0 * s.ldc + c0, matrix * s.stride_d + r0 * s.ldd + c0};
}

}  // namespace dmuon::ns::cuda
