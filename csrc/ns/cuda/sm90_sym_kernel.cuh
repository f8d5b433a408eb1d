// dmuon/ns/cuda/sm90_sym_kernel.cuh — the sm_90a symmetric-product kernel template
// D = α·A·Bᵀ + β·C with a symmetric result. Included by one .cu per element type
// (sm90_sym_product_{f16,bf16}.cu) so the instances compile in parallel.
//
// Persistent, warp-specialized kernel (CuTe primitives from the CUTLASS headers):
//   warpgroup 0   producer: one thread issues TMA loads of the A and B k-panels of each
//                 work tile into a kStages-deep shared-memory ring (full/empty mbarriers);
//   warpgroups 1–2 consumers: WGMMA 64×128×16 each (the two stacked make a 128×128 tile),
//                 fp32 accumulators, one WGMMA batch kept in flight; then the epilogue.
// Work = (lower-triangle tile (i ≥ j), batch index), enumerated tile-major within each
// matrix so that neighbouring CTAs share A/B panels in L2; each CTA strides over the work
// list (grid = number of SMs unless configured). Each output element is written exactly
// once and D is exactly symmetric (the value of (r, c), r ≥ c, is also stored at (c, r)).
// NOTE: exact symmetry matters: the antisymmetric part of the rounding error otherwise
// grows through the Gram iteration (see the NOTE in csrc/torch/aten_ns_backend.h).
//
// Three epilogues (template parameter kEpi, an Sm90Epilogue):
//   direct    each thread forms α·acc + β·C in fp32 and stores the 16-bit value and its
//             mirror straight from the accumulator layout (2-byte, strided mirror stores);
//   staged    the rounded tile goes to a swizzled shared-memory tile first; then 16-byte
//             coalesced stores of the rows and of the transposed rows (the mirror);
//   tmastore  the producer TMA-loads the C tile into a shared-memory tile during the
//             mainloop; the consumers write the rounded tile over it and its transpose into
//             a second one, in 8×8 blocks (ldmatrix, stmatrix, stmatrix .trans), and one
//             thread issues TMA stores of both (clipped at m × m by the TMA unit), which
//             drain while the consumers run the next tile's mainloop.
//
// Tail split-K ("sk-", a runtime switch of the tmastore kernels: 128×128 units 1-CTA and mc2,
// 128×256 units mc2; Traits::kCanSplit; Params::split > 1): when the units do not fill the
// last wave of CTAs, the whole waves run as above and each unit of the partial last wave is
// cut into `split` k-slices, one per CTA (choose_tail_split) (mc2: each pair of the partial
// last wave into `split` pairs of slices, one per cluster, both CTAs on the same k-tiles so
// the shared panel is still multicast).
// A slice stores its fp32 accumulators to scratch (fragment order: coalesced, and every
// slice's thread holds the same (r, c) elements), fences, and counts itself in the tile's
// counter; the slice that counts last sums all slices in slice order (deterministic: the
// same sums whichever finishes last) and runs the tile's epilogue. Nobody waits for another
// CTA, so the scheme needs no co-residency. The counters are zeroed by a memset before each
// launch.
//
// 128×256 units ("n256", kTileN = 256; 1-CTA, staged or direct epilogue): a unit is row
// tile i × column block b (column tiles 2b, 2b + 1, 2b ≤ i; sm90_sym_units.h), one 256-row
// B panel, and each consumer warpgroup runs one 64×256×16 WGMMA per k-step instead of one
// 64×128×16. The epilogue runs once per column tile of the unit, on that tile's half of the
// accumulators (fragment_tiles_split_by_column). The tile above the diagonal that an even
// row's last unit holds is computed, not written: 3% more work at 28 row tiles.
// NOTE: why: per FLOP, a 128×256 unit reads 25% less operand data from L2 (48 KiB a k-tile
// for 4.2 MFLOP against 32 KiB for 2.1) and 17% less from shared memory; the 128×128 kernel
// trails cuBLAS's dense mainloop rate by a third (BENCHMARKS.md run F).
// Measured on an H200 (2026-11-29, BENCHMARKS.md run G): 0.52–0.96× the best 128×128
// configuration on every shape tried, hence experimental (sm90_sym_config.cpp).
//
// Wide tmastore ("n256-tmastore", 1-CTA, and "mc2-n256-tmastore", 2-CTA clusters; s4): the
// 128×256 units with a TMA-store epilogue. Four 48 KiB stages leave 32 KiB: one 128×64
// subtile buffer and its 64×128 mirror, reused four times a unit (wide_tmastore_epilogue).
// β·C goes through the ring: after a unit's k-tiles the producer loads each of its two C
// tiles as one more stage use (load_c_slots), so C arrives as early as the k-tiles do.
// mc2: pairs of units over one 256-row B panel (rows 2q, 2q + 1), multicast in two 128-row
// slices; the pair list is sm90_sym_units.h's make_wide_pair_list. The C stage uses are
// local loads, taken and released by both CTAs (I1: the same count of stage uses; their
// releases follow I3 as those of units that share nothing).
// NOTE: why: under the power limit CUTLASS's 128×256 tiles in 2-CTA clusters ran 1.50 GHz
// against 1.36 for our mc2 128×128 (BENCHMARKS.md run J): per FLOP they read 1.5× fewer
// L2 bytes.
//
// 2-CTA cluster variant ("mc2", kCluster = 2). First run on an H200 2026-11-29: correct,
// memcheck and racecheck clean, up to 1.08× on long-k X·Xᵀ (sm90_sym_config.cpp).
// NOTE: why: long-k X·Xᵀ products spend > 85% of their time in the mainloop at 460–510
// executed TFLOP/s (cuBLAS dense: 650–770); a 128×128×64 k-tile is 32 KiB of L2 reads per
// 2.1 MFLOP, about 15 TB/s over 132 SMs at peak. Sharing one of the two panels halves it.
//   Work: clusters of 2 CTAs walk a list of tile pairs (sm90_sym_pairs.h); CTA rank r takes
//   tile r of the pair. Column pairs (i, j), (i+1, j) share the B panel j, row pairs
//   (R−1, j), (R−1, j−2) share the A panel R−1, pairs of lone tiles of two matrices share
//   nothing, and a last lone tile is run by both CTAs (rank 1 computes, writes nothing).
//   Loads: the shared panel's k-tile is issued as two TMA slices, one by each CTA, each
//   multicast (mask 0b11) to the same shared-memory offset in both CTAs and completing
//   transaction bytes on the full barrier at the same offset in both; the other panel is a
//   plain TMA load of the CTA's own. A unit that shares nothing loads both panels plainly.
//   Invariants of the barrier protocol:
//   I1 lockstep: both CTAs walk the same units with the same k-tile count, so stage use n
//      (n-th fill of the ring, counted over all units) is the same stage and phase in both.
//   I2 full[s] (count 1, local): the CTA's own producer arrives with expect-tx = 32 KiB (own
//      A + B, whatever the kind: own panel 16 KiB + both 8 KiB slices of the shared one,
//      or 2 × 16 KiB own). The peer's slice may complete its bytes before that arrive: the
//      tx-count goes negative and the phase cannot complete while the arrival is pending.
//   I3 empty[s] (count 2 CTAs × 8 consumer warps = 16): after a stage use's WGMMAs retired
//      (warpgroup_wait in that warp), lane 0 of every consumer warp arrives on empty[s] of
//      BOTH CTAs (mapa + remote mbarrier.arrive). A producer waits on its own empty[s] only,
//      so it issues use n+kStages into stage s only after both CTAs' consumers released use
//      n: its multicast slice then never overwrites a stage the peer still reads. Every unit
//      (also those that share nothing) follows this rule, so the rule needs no mode switch.
//   I4 no early arrivals: a peer's arrival for use n+kStages on our empty[s] needs its full
//      barrier for that use, which needs our slice (or, for units sharing nothing, its own
//      producer, which waited on its empty[s] = both CTAs' release of use n): an arrival is
//      never counted into the phase of an earlier use. Likewise no transaction bytes of use
//      n+kStages reach our full[s] before our consumers waited for use n.
//   I5 start/exit: barriers are initialized and fenced (fence.mbarrier_init) before a
//      cluster_sync, so no remote arrive or multicast reaches an uninitialized barrier; every
//      thread of both CTAs (producer warpgroup included, no early return) ends with a
//      cluster_sync, so no CTA exits while its peer may still arrive on its barriers.
//      Multicast writes into a CTA are all for stage uses its own consumers wait for, so
//      they have landed before its consumers finish.
//   I6 the epilogues, the tmastore barriers (c_full, epi_empty) and the C loads stay local;
//      rank 1 of a shadow unit skips its C load and its epilogue (both, so their parities
//      stay matched).
#pragma once

// NOTE: cute/tensor.hpp must come first (the atom headers assume its declarations).
#include <cute/tensor.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "ns/cuda/cuda_check.h"
#include "ns/cuda/sm90_sym_pairs.h"
#include "ns/cuda/sm90_sym_product.h"
#include "ns/cuda/sm90_sym_units.h"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

// Compile-time shape of the kernel.
// NOTE: 128×128×64 tiles are 32 KiB a stage; 64 fp32 accumulators per consumer thread;
// one CTA per SM. Square tiles keep diagonal tiles aligned with the triangle. The staged
// epilogue adds a 32 KiB 16-bit tile, so it fits up to 6 stages (227 KiB limit).
// NOTE: the tmastore epilogue keeps two 32 KiB tiles (tile, mirror): up to 5 stages.
// NOTE: kClusterT = 2: the "mc2" variant (2-CTA clusters, one operand panel multicast; see
// the block "2-CTA cluster variant" below the kernel's header comment). 1: the plain kernel.
// NOTE: kTileNT = 256: the "n256" variant (128×256 units, see "128×256 units" in the header).
template <class Elem, int kStagesT, int kEpiT, int kClusterT = 1, int kTileNT = 128>
struct Traits {
  using Element = Elem;
  static constexpr int kTile = 128;
  static constexpr int kTileK = 64;
  static constexpr int kStages = kStagesT;
  static constexpr int kCluster = kClusterT;
  static_assert(kCluster == 1 || kCluster == 2, "clusters of 1 or 2 CTAs");
  // Columns of a unit (one B panel): 128, or 256 = two column tiles.
  static constexpr int kTileN = kTileNT;
  static constexpr int kColTiles = kTileN / kTile;
  static constexpr bool kStaged = kEpiT == static_cast<int>(Sm90Epilogue::kStaged);
  static constexpr bool kTmaStore = kEpiT == static_cast<int>(Sm90Epilogue::kTmaStore);
  // 128×256 units with the tmastore epilogue ("wide tmastore"; see its block in the header).
  static constexpr bool kWide = kColTiles == 2 && kTmaStore;
  static_assert(kColTiles == 1 || (kColTiles == 2 && (kCluster == 1 || kTmaStore)),
                "128x256 units: 1-CTA with any epilogue, 2-CTA clusters with tmastore");
  // Instances with the tail split-K compiled in: the 128×128 tmastore ones and mc2's wide one.
  // NOTE: in the 1-CTA wide instance its registers made ptxas serialize the WGMMAs (C7511,
  // 2 KiB of spills; nvcc 13, 2026-11-30), in the staged and direct ones likewise.
  static constexpr bool kCanSplit = kTmaStore && (kColTiles == 1 || kCluster == 2);
  static constexpr int kNumConsumerThreads = 256;
  static constexpr int kNumThreads = 128 + kNumConsumerThreads;
  static constexpr int kTxBytes = (kTile + kTileN) * kTileK * static_cast<int>(sizeof(Elem));
  // fp32 accumulators per consumer thread for one 128×128 output tile.
  static constexpr int kTileValues = kTile * kTile / kNumConsumerThreads;
  static constexpr int kEpilogueElems = kStaged ? kTile * kTileN : 8;
  // tmastore: the tile and mirror buffers (wide: a 128×64 subtile and its 64×128 mirror).
  static constexpr int kTmaTileElems = kWide ? kTile * 64 : kTmaStore ? kTile * kTile : 8;
  // Wide tmastore: subtile buffer pairs. NOTE: with 3 stages (144 KiB) two 32 KiB pairs fit,
  // used in turn, so a subtile waits only for the stores of the one before the last; with 4
  // stages one pair, and each subtile waits for the last one's stores.
  static constexpr int kEpiBuffers = (kWide && kStages == 3) ? 2 : 1;
  static constexpr int kTileBytes = kTile * kTile * static_cast<int>(sizeof(Elem));

  using SmemLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                            make_shape(Int<kTile>{}, Int<kTileK>{}, Int<kStages>{})));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             make_shape(Int<kTileN>{}, Int<kTileK>{}, Int<kStages>{})));
  // Each consumer warpgroup: 64 rows × kTileN columns (n256: one 64×256×16 WGMMA a k-step).
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<Int<64>, Int<kTileN>, Int<kTileK>>,
                           GMMA::Major::K, GMMA::Major::K>(),
      Layout<Shape<_2, _1, _1>>{}));

  // A (m, k, batch) row-major gmem view: k contiguous.
  static auto gmem(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tensor(make_gmem_ptr(ptr), make_shape(m, k, batch), make_stride(ld, Int<1>{}, stride));
  }
  static auto tma(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD{}, gmem(ptr, m, k, batch, ld, stride), SmemLayout{}(_, _, 0),
                         make_shape(Int<kTile>{}, Int<kTileK>{}));
  }
  using TmaAtom = decltype(tma(nullptr, 1, 1, 1, 8, 8));
  // B panels: (kTileN, kTileK) boxes.
  static auto tma_b(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD{}, gmem(ptr, m, k, batch, ld, stride), SmemLayoutB{}(_, _, 0),
                         make_shape(Int<kTileN>{}, Int<kTileK>{}));
  }
  using TmaAtomB = decltype(tma_b(nullptr, 1, 1, 1, 8, 8));
  // mc2: the same (kTile, kTileK) panel k-tile, issued as kCluster slices (one per CTA of the
  // cluster, each multicast to every CTA of it).
  static auto tma_mc(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD_MULTICAST{}, gmem(ptr, m, k, batch, ld, stride), SmemLayout{}(_, _, 0),
                         make_shape(Int<kTile>{}, Int<kTileK>{}), Int<kCluster>{});
  }
  using TmaAtomMc = conditional_t<(kCluster > 1), decltype(tma_mc(nullptr, 1, 1, 1, 8, 8)), char>;
  // mc2 with 128×256 units: the shared 256-row B panel's k-tile, as kCluster slices.
  static auto tma_mc_b(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD_MULTICAST{}, gmem(ptr, m, k, batch, ld, stride), SmemLayoutB{}(_, _, 0),
                         make_shape(Int<kTileN>{}, Int<kTileK>{}), Int<kCluster>{});
  }
  using TmaAtomMcB = conditional_t<(kCluster > 1), decltype(tma_mc_b(nullptr, 1, 1, 1, 8, 8)), char>;
  // mc2: empty-barrier arrivals per stage use: lane 0 of each of the 8 consumer warps, of
  // every CTA of the cluster (plain kernel: every consumer thread of the CTA).
  static constexpr int kEmptyArrivals = kCluster > 1 ? kCluster * kNumConsumerThreads / 32 : kNumConsumerThreads;

  // tmastore: the 128×128 output tile in shared memory, 128-byte swizzled (8×64 atoms), the
  // layout of both the C load and the D stores. NOTE: the swizzle makes the accumulator-
  // layout writes of the tile and of its transpose free of bank conflicts.
  using EpiLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                           make_shape(Int<kTile>{}, Int<kTile>{})));
  // D and C as (m, m, batch) TMA views, one 128×128 box per tile (two 128×64 boxes issued).
  static auto tma_store_d(Elem* ptr, int m, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_STORE{},
                         make_tensor(make_gmem_ptr(ptr), make_shape(m, m, batch), make_stride(ld, Int<1>{}, stride)),
                         EpiLayout{}, make_shape(Int<kTile>{}, Int<kTile>{}));
  }
  static auto tma_load_c(const Elem* ptr, int m, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD{}, gmem(ptr, m, m, batch, ld, stride), EpiLayout{},
                         make_shape(Int<kTile>{}, Int<kTile>{}));
  }
  // Wide tmastore: D stored in 64×64 boxes (SubLayout: the tile buffer holds two, the mirror
  // two), C loaded as two 128×64 boxes (the A panel's box) into a ring stage.
  using SubLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{}, make_shape(Int<64>{}, Int<64>{})));
  using StageLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                              make_shape(Int<kTile>{}, Int<kTileK>{})));
  static auto tma_store_sub(Elem* ptr, int m, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_STORE{},
                         make_tensor(make_gmem_ptr(ptr), make_shape(m, m, batch), make_stride(ld, Int<1>{}, stride)),
                         SubLayout{}, make_shape(Int<64>{}, Int<64>{}));
  }
  using TmaStoreD = conditional_t<kWide, decltype(tma_store_sub(nullptr, 1, 1, 8, 8)),
                                  conditional_t<kTmaStore, decltype(tma_store_d(nullptr, 1, 1, 8, 8)), char>>;
  using TmaLoadC = conditional_t<kWide, TmaAtom, conditional_t<kTmaStore, decltype(tma_load_c(nullptr, 1, 1, 8, 8)), char>>;

  struct SharedStorage {
    alignas(1024) ArrayEngine<Elem, cosize_v<SmemLayout>> a;  // [kStages][kTile, kTileK] swizzled
    alignas(1024) ArrayEngine<Elem, cosize_v<SmemLayoutB>> b;  // [kStages][kTileN, kTileK] swizzled
    alignas(16) Elem epilogue[kEpilogueElems];  // staged only: [kColTiles][kTile, kTile] swizzled
    alignas(1024) Elem tile[kTmaTileElems * kEpiBuffers];    // [kTile, kTile] EpiLayout: C, then D's tile (tmastore)
    alignas(1024) Elem mirror[kTmaTileElems * kEpiBuffers];  // [kTile, kTile] EpiLayout: the tile transposed (tmastore)
    alignas(8) uint64_t full[kStages];   // TMA → consumers: stage loaded
    alignas(8) uint64_t empty[kStages];  // consumers → TMA: stage free
    alignas(8) uint64_t c_full;          // tmastore: TMA → consumers: C tile loaded
    alignas(8) uint64_t epi_empty;       // tmastore: last TMA store has read tile/mirror
    int split_last;                      // split-K: this slice was its tile's last to finish
  };

  struct Params {
    TmaAtom tma_a;
    TmaAtomB tma_b;
    TmaStoreD tma_d;  // tmastore only
    TmaLoadC tma_c;   // tmastore only (D's view when there is no C: never loaded)
    int m, k, batch, num_row_tiles;
    int64_t num_tri, num_work;
    const Elem* c;  // [batch, m, ldc] (may be null when beta == 0)
    int64_t ldc, stride_c;
    Elem* d;        // [batch, m, ldd]
    int64_t ldd, stride_d;
    float alpha, beta;
    // mc2 only (NOTE: last, so that the plain kernel's parameter offsets stay as they were).
    TmaAtomMc tma_am;   // multicast slices of the A panels
    TmaAtomMcB tma_bm;  // multicast slices of the B panels
    PairList pairs;            // the pair list (sm90_sym_pairs.h)
    // Split-K (kCanSplit): units w < num_full are whole units (mc2: pairs); then `split`
    // k-slices of each remaining unit (mc2: of each remaining pair, both units).
    // split == 1: every unit is whole (num_full == num_work).
    int64_t num_full;
    int split;
    int* counters;    // [tail tiles (mc2: 2 a tail pair)] slices finished (zeroed before the launch)
    float* partials;  // [tail tiles][split][16 (n256: 32)][256] float4: each slice's accumulators
  };
};

// Ring position: stage index and the parity of its current round.
template <int kStages>
struct RingState {
  int index;
  uint32_t phase;
  __device__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// Lower-triangle tile t → (row tile i, col tile j), i ≥ j, t = i(i+1)/2 + j.
__device__ __forceinline__ void decode_triangle(int64_t t, int& i, int& j) {
  int r = static_cast<int>((sqrt(8.0 * static_cast<double>(t) + 1.0) - 1.0) * 0.5);
  while (static_cast<int64_t>(r) * (r + 1) / 2 > t) --r;
  while (static_cast<int64_t>(r + 1) * (r + 2) / 2 <= t) ++r;
  i = r;
  j = static_cast<int>(t - static_cast<int64_t>(r) * (r + 1) / 2);
}

// Staged epilogue tile: element (r, c) of the 128×128 tile, 16-byte chunks XOR-swizzled.
// NOTE: the swizzle (chunk ^ r%8 ^ (r/8)%8) makes three access patterns conflict-free:
// the accumulator-layout writes (8 rows × one chunk), the row reads (16 chunks of a row)
// and the mirror's column reads (rows r8·8 + i for 8 consecutive r8).
__device__ __forceinline__ int epilogue_index(int r, int c) {
  return r * 128 + ((((c >> 3) ^ (r & 7) ^ ((r >> 3) & 7)) & 15) << 3) + (c & 7);
}

// tmastore epilogue tile: element (r, c) of Traits::EpiLayout (128×128, 8×64 atoms with the
// 128-byte swizzle: 16-byte chunk (c/8)%8 of row r XOR r%8; column halves 8192 apart).
// NOTE: computed here rather than through the CuTe tensor: indexing that tensor for the 64
// accumulator values kept 128 smem offsets live across the tile loop (168 registers,
// 640 bytes of spills per thread in ptxas -v, nvcc 13, 2026-11-29).
__host__ __device__ __forceinline__ int tma_tile_index(int r, int c) {
  return ((c >> 6) << 13) + (r << 6) + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
}

// tmastore epilogue in 8×8 matrices of 16-bit values (ldmatrix / stmatrix).
// A consumer warp's accumulators hold 16 rows of the tile (rows 16·warp …, checked on the
// host: fragment_is_mma_layout) as 8×8 blocks in the mma fragment layout: lane ℓ holds row
// ℓ/4, columns 2·(ℓ%4) and 2·(ℓ%4) + 1 of each block. ldmatrix reads C's blocks into that
// layout, stmatrix writes the rounded blocks to the tile, and stmatrix .trans writes them
// transposed to the mirror. In an x4 instruction lane ℓ gives the address of row ℓ%8 of
// block ℓ/8 and register q carries block q. Every row address is a 16-byte chunk of the
// swizzled tile (tma_tile_index of a column multiple of 8).
// NOTE: why: the per-element epilogue issued 192 shared-memory accesses and 128 index
// computations per thread and tile; in 8×8 blocks it is 24 instructions. Measured on an
// H200 (2026-11-30, BENCHMARKS.md run I): β·C products 896³ b72 14–17% and 1536³ b56 6–15%
// faster on every tmastore configuration, long-k X·Xᵀ within ±3%.
__device__ __forceinline__ void load_blocks_x4(const void* row, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(cute::cast_smem_ptr_to_uint(row))
               : "memory");
}
__device__ __forceinline__ void store_blocks_x4(void* row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   cute::cast_smem_ptr_to_uint(row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void store_blocks_x4_transposed(void* row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   cute::cast_smem_ptr_to_uint(row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// A 16-byte chunk of 16-bit values at columns c0 … c0 + 7 of row r of a diagonal tile: the
// values above the diagonal (column > r) are taken from the chunk at `from`, the others kept.
__device__ __forceinline__ void take_above_diagonal(uint4* to, const uint4* from, int r, int c0) {
  const uint4 source = *from;
  if (c0 > r) {
    *to = source;
    return;
  }
  uint4 merged = *to;
  uint32_t* m32 = reinterpret_cast<uint32_t*>(&merged);
  const uint32_t* f32 = reinterpret_cast<const uint32_t*>(&source);
  CUTE_UNROLL
  for (int e = 0; e < 8; ++e) {
    if (c0 + e <= r) continue;
    const uint32_t mask = 0xffffu << (16 * (e % 2));
    m32[e / 2] = (m32[e / 2] & ~mask) | (f32[e / 2] & mask);
  }
  *to = merged;
}

// Two fp32 values rounded to Elem (as static_cast does), packed low first; and back.
template <class Elem>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  return static_cast<uint32_t>(static_cast<Elem>(lo).raw()) | (static_cast<uint32_t>(static_cast<Elem>(hi).raw()) << 16);
}
template <class Elem>
__device__ __forceinline__ float low_of(uint32_t v) {
  return static_cast<float>(Elem::bitcast(static_cast<uint16_t>(v & 0xffffu)));
}
template <class Elem>
__device__ __forceinline__ float high_of(uint32_t v) {
  return static_cast<float>(Elem::bitcast(static_cast<uint16_t>(v >> 16)));
}

// `v`, which the compiler must treat as unknown here: what is computed from it stays in
// the loop iteration that computes it.
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

// Consumers only (256 threads): named barrier 1 (0 is __syncthreads).
__device__ __forceinline__ void consumer_barrier() {
  asm volatile("bar.sync 1, 256;" ::: "memory");
}

// mc2: lane 0 of every consumer warp, after its warp's WGMMAs on `stage` retired, releases
// the stage in both CTAs of the cluster (invariant I3). Plain kernel: every consumer thread.
template <class T>
__device__ __forceinline__ void release_stage(uint64_t* empty, int stage) {
  if constexpr (T::kCluster > 1) {
    const uint32_t lane0 = (threadIdx.x % 32) == 0;
    CUTE_UNROLL
    for (uint32_t cta = 0; cta < T::kCluster; ++cta) cutlass::arch::ClusterBarrier::arrive(&empty[stage], cta, lane0);
    __syncwarp();  // NOTE: the warp converged again before the next (aligned) WGMMA
  } else {
    cutlass::arch::ClusterBarrier::arrive(&empty[stage]);
  }
}

// One unit of a CTA's work: a tile (matrix l, row tile ti, col tile tj) over k-tiles
// [k_begin, k_end). mc2: `kind` is the pair kind and `writes` false where this CTA only
// shadows its peer's tile. Split-K: `slot` (tail tile) and `part` (its slice), −1 for a whole tile.
struct WorkUnit {
  int l, ti, tj;
  int k_begin, k_end;
  int slot, part;
  PairKind kind;
  bool writes;
};

// Work item w of this CTA → its unit (mc2: w is a pair-list unit).
template <class T>
__device__ __forceinline__ WorkUnit decode_work(const typename T::Params& p, int64_t w, int num_k_tiles) {
  WorkUnit u{0, 0, 0, 0, num_k_tiles, -1, -1, PairKind::kSeparate, true};
  // NOTE: slices of balanced length (the split never exceeds num_k_tiles / 4).
  auto slice = [&](int64_t v) {
    u.part = static_cast<int>(v % p.split);
    u.k_begin = static_cast<int>(static_cast<int64_t>(u.part) * num_k_tiles / p.split);
    u.k_end = static_cast<int>(static_cast<int64_t>(u.part + 1) * num_k_tiles / p.split);
    return v / p.split;
  };
  if constexpr (T::kCluster > 1) {
    const int rank = static_cast<int>(cute::block_rank_in_cluster());
    int64_t pair = w;
    if (w >= p.num_full) {
      // Split-K tail: slice `part` of both tiles of a tail pair, the same slice in both CTAs
      // (same k-tiles: I1), the shared panel still multicast; tile r of tail pair q has slot
      // 2q + r (a shadow pair's rank 1 writes nothing and never counts).
      const int64_t q = slice(w - p.num_full);
      pair = p.num_full + q;
      u.slot = static_cast<int>(2 * q + rank);
    }
    // NOTE: with 128×256 units, u.tj is the column block (as in the 1-CTA decode below).
    const PairTile t = T::kColTiles == 2 ? decode_wide_pair(p.pairs, pair, rank) : decode_pair(p.pairs, pair, rank);
    u.l = t.l;
    u.ti = t.ti;
    u.tj = t.tj;
    u.kind = t.kind;
    u.writes = t.writes;
  } else {
    int64_t tile = w;
    if (w >= p.num_full) {
      u.slot = static_cast<int>(slice(w - p.num_full));
      tile = p.num_full + u.slot;
    }
    u.l = static_cast<int>(tile / p.num_tri);
    if constexpr (T::kColTiles == 2) {
      decode_wide(tile % p.num_tri, u.ti, u.tj);  // NOTE: u.tj is the column block
    } else {
      decode_triangle(tile % p.num_tri, u.ti, u.tj);
    }
  }
  return u;
}

// mc2 producer: the A and B k-tiles `kt` of one stage use. The shared panel (B for kShareB
// and kShadow units, A for kShareA) as this CTA's slice of it, multicast to both CTAs (the
// peer issues the other slice); the other panel, and both in a kSeparate unit, as plain
// loads of this CTA's own (the caller's partitions).
template <class T, class SmemA, class SmemB, class TAgA, class TAsA, class TBgB, class TBsB>
__device__ __forceinline__ void load_panels_mc2(const typename T::Params& p, PairKind kind, int l, int ti, int tj,
                                                int kt, int stage, const SmemA& sA, const SmemB& sB, uint64_t* full,
                                                const TAgA& tAgA, const TAsA& tAsA, const TBgB& tBgB,
                                                const TBsB& tBsB) {
  constexpr uint16_t kMask = (1u << T::kCluster) - 1;  // every CTA of the cluster: 0b11
  const int rank = static_cast<int>(cute::block_rank_in_cluster());
  // This CTA's slice of panel `row_tile` (`rows` rows, k-tile kt), into both CTAs' stage `stage`.
  auto multicast = [&](const auto& atom, const auto& smem_panels, int row_tile, auto rows) {
    Tensor m = atom.get_tma_tensor(make_shape(p.m, p.k, p.batch));  // (m, k, batch) coords
    Tensor g = local_tile(m(_, _, l), make_shape(rows, Int<T::kTileK>{}),
                          make_coord(row_tile, _));  // (rows, kTileK, k_tiles)
    auto [tg, ts] = tma_partition(atom, rank, Layout<Int<T::kCluster>>{}, group_modes<0, 2>(smem_panels),
                                  group_modes<0, 2>(g));  // (TMA slice, k_tiles), (TMA slice, kStages)
    copy(atom.with(*full, kMask), tg(_, kt), ts(_, stage));
  };
  if (kind == PairKind::kShareA) {
    multicast(p.tma_am, sA, ti, Int<T::kTile>{});
  } else {
    copy(p.tma_a.with(*full), tAgA(_, kt), tAsA(_, stage));
  }
  if (kind == PairKind::kShareB || kind == PairKind::kShadow) {
    multicast(p.tma_bm, sB, tj, Int<T::kTileN>{});  // NOTE: tj: the column block of a 128×256 unit
  } else {
    copy(p.tma_b.with(*full), tBgB(_, kt), tBsB(_, stage));
  }
}

// Split-K, consumers (256 threads): store this slice's accumulators, count the slice in its
// tile's counter; true (with `acc` the sum of every slice, in slice order) for the slice
// that counted last, false for the others.
// NOTE: the threadfence-reduction pattern: each thread's stores are fenced before the
// barrier that precedes the counting atomic; the last slice fences again before it reads
// (L2-coherent loads: the other slices' stores never sat in this SM's L1).
template <class T, class Acc>
__device__ __forceinline__ bool split_k_reduce(const typename T::Params& p, const WorkUnit& u, int consumer_idx,
                                               Acc& acc, int* split_last) {
  constexpr int kValues = decltype(size(acc))::value;  // 64 (128×128 units) or 128 (128×256)
  static_assert(kValues == T::kColTiles * T::kTileValues, "fp32 accumulators of one unit per consumer thread");
  constexpr int kVecs = kValues / 4, kThreads = T::kNumConsumerThreads;
  float4* tile_slices = reinterpret_cast<float4*>(p.partials) + static_cast<int64_t>(u.slot) * p.split * kVecs * kThreads;
  float4* mine = tile_slices + static_cast<int64_t>(u.part) * kVecs * kThreads + consumer_idx;
  CUTE_UNROLL
  for (int q = 0; q < kVecs; ++q)
    __stcg(mine + q * kThreads, make_float4(acc(4 * q), acc(4 * q + 1), acc(4 * q + 2), acc(4 * q + 3)));
  __threadfence();
  consumer_barrier();
  if (consumer_idx == 0) *split_last = atomicAdd(&p.counters[u.slot], 1) == p.split - 1;
  consumer_barrier();
  if (!*split_last) return false;
  __threadfence();
  CUTE_UNROLL
  for (int q = 0; q < kVecs; ++q) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int part = 0; part < p.split; ++part) {
      const float4 v = part == u.part ? make_float4(acc(4 * q), acc(4 * q + 1), acc(4 * q + 2), acc(4 * q + 3))
                                      : __ldcg(tile_slices + (static_cast<int64_t>(part) * kVecs + q) * kThreads +
                                               consumer_idx);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    acc(4 * q) = sum.x, acc(4 * q + 1) = sum.y, acc(4 * q + 2) = sum.z, acc(4 * q + 3) = sum.w;
  }
  return true;
}

// Wide tmastore buffers: element (r, c) of the 128×64 subtile (= of the C half-tile in a ring
// stage: the A panel's layout), and of its 64×128 mirror (two 64×64 halves, 4096 apart). Both
// are 64×64 boxes of 8×64 atoms with the 128-byte swizzle (Traits::SubLayout).
__host__ __device__ __forceinline__ int subtile_index(int r, int c) {
  return (r << 6) + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
}
__host__ __device__ __forceinline__ int sub_mirror_index(int r, int c) { return ((c >> 6) << 12) + subtile_index(r, c); }

// Wide tmastore: where half `half` (columns 64·half …) of a C tile lies in ring stage
// `stage`: the stage's A panel, or the first 128 rows of its B panel (both 128×64 in
// StageLayoutA, at subtile_index). The producer's loads and the consumers' reads use it both.
template <class T, class Storage>
__device__ __forceinline__ typename T::Element* c_half_in_stage(Storage& smem, int stage, int half) {
  return half == 0 ? smem.a.begin() + stage * T::kTile * T::kTileK : smem.b.begin() + stage * T::kTileN * T::kTileK;
}

// Wide tmastore, producer: the C tiles (row tile u.ti, column tiles 2·u.tj and 2·u.tj + 1)
// of a unit, each as one stage use of the ring: its columns 0–63 into the stage's A panel,
// 64–127 into the first half of its B panel (two 128×64 boxes, 32 KiB of transaction bytes;
// a box outside the matrix is zero-filled and still counts its bytes).
// NOTE: why the ring: the 48 KiB stages leave room beside 4 of them for one 32 KiB epilogue
// buffer only; a C tile in its own buffer would cost a stage. In the ring the loads are
// issued kStages − 1 k-tiles ahead of the epilogue, as the k-tiles are.
template <class T, class Storage>
__device__ __forceinline__ void load_c_slots(const typename T::Params& p, const WorkUnit& u, Storage& smem,
                                             RingState<T::kStages>& state) {
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  Tensor mC = p.tma_c.get_tma_tensor(make_shape(p.m, p.m, p.batch));  // (m, m, batch) coords
  Tensor gC = local_tile(mC(_, _, u.l), make_shape(Int<T::kTile>{}, Int<T::kTileK>{}),
                         make_coord(u.ti, _));  // (kTile, 64, column boxes)
  for (int h = 0; h < T::kColTiles; ++h) {
    EmptyBarrier::wait(&smem.empty[state.index], state.phase);
    FullBarrier::arrive_and_expect_tx(&smem.full[state.index], T::kTileBytes);
    for (int half = 0; half < 2; ++half) {
      Tensor sX = make_tensor(make_smem_ptr(c_half_in_stage<T>(smem, state.index, half)),
                              typename T::StageLayoutA{});  // (kTile, 64)
      auto [tXgC, tXsX] = tma_partition(p.tma_c, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sX),
                                        group_modes<0, 2>(gC));  // (TMA, column boxes), (TMA)
      copy(p.tma_c.with(smem.full[state.index]), tXgC(_, 2 * (T::kColTiles * u.tj + h) + half), tXsX);
    }
    state.advance();
  }
}

// Wide tmastore, consumers (256 threads): the epilogue of a 128×256 unit (nothing is written
// unless `writes`). Per column tile h
// (the C stage use first, when β ≠ 0, taken and released whether or not this CTA writes) and
// per 64-column subtile: α·acc + β·C rounded once into the subtile buffer and transposed into
// the mirror, in 8×8 blocks as the 128×128 tmastore epilogue; then one thread issues TMA
// stores of its 64×64 boxes. The buffers are reused once the previous stores have read them.
// A diagonal tile (h = the unit's diagonal) stores: subtile 0's rows 0–63 (its diagonal
// quadrant, upper part merged from the mirror) and 64–127, and its mirror's columns 64–127
// (the quadrant above the diagonal, from values below it); subtile 1's rows 64–127 (merged).
// A column tile above the diagonal (h = 1 of an even row's last unit) is not written.
// NOTE: why subtiles: four 48 KiB stages and one 32 KiB buffer pair fit in 227 KiB; 128×128
// tile and mirror (64 KiB) would leave 3 stages.
template <class T, class Acc, class Storage>
__device__ __forceinline__ void wide_tmastore_epilogue(const typename T::Params& p, const WorkUnit& u, bool with_c,
                                                       bool writes, int consumer_idx, const Acc& acc, Storage& smem,
                                                       RingState<T::kStages>& state, bool& store_pending,
                                                       int& epi_seq) {
  using Elem = typename T::Element;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  const int warp = consumer_idx / 32, lane = consumer_idx % 32;
  const int quad = lane / 8, sub = lane % 8;  // the block this lane addresses, and its row
  const int row = 16 * warp + 8 * (quad % 2) + sub;
  Tensor mD = p.tma_d.get_tma_tensor(make_shape(p.m, p.m, p.batch));  // (m, m, batch) coords
  // One 64×64 box of D from shared memory `from` (SubLayout), clipped at m × m.
  auto store_box = [&](Elem* from, int box_row, int box_col) {
    Tensor sX = make_tensor(make_smem_ptr(from), typename T::SubLayout{});
    Tensor gX = local_tile(mD(_, _, u.l), make_shape(Int<64>{}, Int<64>{}), make_coord(box_row, box_col));
    auto [tXgX, tXsX] = tma_partition(p.tma_d, group_modes<0, 2>(sX), group_modes<0, 2>(gX));
    copy(p.tma_d, tXsX, tXgX);
  };
  cute::for_each(make_int_sequence<T::kColTiles>{}, [&](auto h_) {
    constexpr int h = decltype(h_)::value;
    const int tj = T::kColTiles * u.tj + h;
    int slot = 0;
    if (with_c) {
      FullBarrier::wait(&smem.full[state.index], state.phase);
      slot = state.index;
    }
    if (writes && tj <= u.ti) {
      const bool diagonal = tj == u.ti;
      cute::for_each(make_int_sequence<2>{}, [&](auto s_) {
        constexpr int s = decltype(s_)::value;
        // This subtile's buffer pair (kEpiBuffers of them in turn), once the stores that last
        // read it are done (with two pairs the latest stores, from the other pair, may still run).
        const int buffer = T::kEpiBuffers > 1 ? epi_seq++ % T::kEpiBuffers : 0;
        Elem* tile = smem.tile + buffer * T::kTmaTileElems;      // [128, 64] at subtile_index
        Elem* mirror = smem.mirror + buffer * T::kTmaTileElems;  // [64, 128] at sub_mirror_index
        if (consumer_idx == 0 && store_pending) {
          tma_store_wait<T::kEpiBuffers - 1>();
          if constexpr (T::kEpiBuffers == 1) store_pending = false;
        }
        consumer_barrier();
        const Elem* c_half = c_half_in_stage<T>(smem, slot, s);  // [128, 64] at subtile_index
        CUTE_UNROLL
        for (int jj = 0; jj < 4; ++jj) {
          const int col = 8 * (2 * jj + quad / 2);  // this lane's block: subtile column
          uint32_t c_pairs[4] = {0u, 0u, 0u, 0u}, out[4];
          if (with_c) load_blocks_x4(c_half + subtile_index(row, col), c_pairs);
          CUTE_UNROLL
          for (int q = 0; q < 4; ++q) {
            // NOTE: accumulator 64h + 8·(4s + jj) + 2q: column tile h, columns 64s + 16jj + 8(q/2) …
            float lo = p.alpha * acc(64 * h + 8 * (4 * s + jj) + 2 * q);
            float hi = p.alpha * acc(64 * h + 8 * (4 * s + jj) + 2 * q + 1);
            if (with_c) {
              lo += p.beta * low_of<Elem>(c_pairs[q]);
              hi += p.beta * high_of<Elem>(c_pairs[q]);
            }
            out[q] = pack_pair<Elem>(lo, hi);
          }
          store_blocks_x4(tile + subtile_index(row, col), out);
          store_blocks_x4_transposed(mirror + sub_mirror_index(col + sub, 16 * warp + 8 * (quad % 2)), out);
        }
        // Diagonal quadrant s (subtile rows 64s …): above its diagonal, (64s + a, c) takes the
        // value computed for (64s + c, 64s + a), which is mirror (a, 64s + c). 16-byte chunks.
        if (diagonal) {
          consumer_barrier();  // NOTE: every warp's mirror blocks are written
          for (int q = consumer_idx; q < 64 * 8; q += T::kNumConsumerThreads) {
            const int a = q / 8, c0 = 8 * (q % 8);
            if (c0 + 7 <= a) continue;  // no element above the diagonal
            take_above_diagonal(reinterpret_cast<uint4*>(tile + subtile_index(64 * s + a, c0)),
                                reinterpret_cast<const uint4*>(mirror + sub_mirror_index(a, 64 * s + c0)), a, c0);
          }
        }
        tma_store_fence();  // the generic-proxy writes, visible to the TMA unit
        consumer_barrier();
        if (consumer_idx == 0) {
          const int box_row = 2 * u.ti, box_col = 2 * tj + s;  // the tile's row boxes, this subtile's column box
          if (!diagonal || s == 0) store_box(tile, box_row, box_col);
          store_box(tile + 4096, box_row + 1, box_col);
          if (!diagonal) store_box(mirror, box_col, box_row);
          if (!diagonal || s == 0) store_box(mirror + 4096, box_col, box_row + 1);
          tma_store_arrive();
          store_pending = true;
        }
        __syncwarp();
      });
    }
    if (with_c) {
      release_stage<T>(smem.empty, slot);
      state.advance();
    }
  });
}

template <class Elem, int kStages, int kEpi, int kCluster, int kTileN>
__global__ void __launch_bounds__(Traits<Elem, kStages, kEpi, kCluster, kTileN>::kNumThreads, 1)
    sym_product_kernel(CUTE_GRID_CONSTANT const typename Traits<Elem, kStages, kEpi, kCluster, kTileN>::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Traits<Elem, kStages, kEpi, kCluster, kTileN>;
  constexpr int kTile = T::kTile, kTileK = T::kTileK;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;

  extern __shared__ char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  const int warpgroup_idx = threadIdx.x / 128;

  // Barrier set-up, visible to the async proxy before any TMA.
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&smem.full[s], 1);
      EmptyBarrier::init(&smem.empty[s], T::kEmptyArrivals);
    }
    if constexpr (T::kTmaStore) {
      FullBarrier::init(&smem.c_full, 1);
      EmptyBarrier::init(&smem.epi_empty, 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  // mc2: both CTAs' barriers initialized before any remote arrive or multicast (I5).
  if constexpr (kCluster > 1) {
    cute::cluster_sync();
  } else {
    __syncthreads();
  }

  Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), typename T::SmemLayout{});  // (kTile, kTileK, kStages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), typename T::SmemLayoutB{});  // (kTileN, kTileK, kStages)
  Tensor mA = p.tma_a.get_tma_tensor(make_shape(p.m, p.k, p.batch));               // (m, k, batch) coords
  Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.m, p.k, p.batch));               // (m, k, batch) coords
  const int num_k_tiles = (p.k + kTileK - 1) / kTileK;
  const auto tile_mk = make_shape(Int<kTile>{}, Int<kTileK>{});
  const auto tile_nk = make_shape(Int<kTileN>{}, Int<kTileK>{});
  const auto tile_mm = make_shape(Int<kTile>{}, Int<kTile>{});
  // tmastore: the k-tile of a unit (counted from its first) after which the consumers
  // release the epilogue tiles (the last tile's TMA stores have read them) and after whose
  // load the producer loads the next C.
  // NOTE: two k-tiles into the next mainloop (chosen, not tuned): 64 KiB of stores
  // should have been read by then, and C is requested about num_k_tiles − 3 k-tiles ahead
  // of its epilogue. The measured gain of the whole epilogue: sm90_sym_configs().
  auto release_kt = [](const WorkUnit& u) { return u.k_begin + std::min(2, u.k_end - u.k_begin - 1); };
  auto c_load_kt = [](const WorkUnit& u) { return u.k_begin + std::min(kStages + 2, u.k_end - u.k_begin - 1); };
  const bool with_c = p.beta != 0.f;
  // Work list (p.num_work units): tiles × batch, strided over CTAs; mc2: pair units, strided
  // over clusters; then split-K's tail slices.
  const int64_t work_begin = blockIdx.x / kCluster, work_step = gridDim.x / kCluster;

  if (warpgroup_idx == 0) {
    // Producer: one thread walks the same work list and fills the ring.
    // NOTE: registers move from the producer warpgroup to the consumers (CUTLASS's 40/232
    // split): the consumers hold 64 fp32 accumulators plus the epilogue's state.
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      RingState<kStages> state{0, 1u};  // NOTE: parity 1 — the first round finds every stage free.
      uint32_t epi_phase = 1u;          // tmastore: likewise, the first C load finds the tile free
      for (int64_t w = work_begin; w < p.num_work; w += work_step) {
        const WorkUnit u = decode_work<T>(p, w, num_k_tiles);
        const int l = u.l, ti = u.ti, tj = u.tj;
        const int c_kt = c_load_kt(u);
        Tensor gA = local_tile(mA(_, _, l), tile_mk, make_coord(ti, _));  // (kTile, kTileK, k_tiles)
        Tensor gB = local_tile(mB(_, _, l), tile_nk, make_coord(tj, _));  // (kTileN, kTileK, k_tiles)
        auto [tAgA, tAsA] = tma_partition(p.tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA),
                                          group_modes<0, 2>(gA));  // (TMA, k_tiles), (TMA, kStages)
        auto [tBgB, tBsB] = tma_partition(p.tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB),
                                          group_modes<0, 2>(gB));  // (TMA, k_tiles), (TMA, kStages)
        for (int kt = u.k_begin; kt < u.k_end; ++kt) {
          EmptyBarrier::wait(&smem.empty[state.index], state.phase);
          FullBarrier::arrive_and_expect_tx(&smem.full[state.index], T::kTxBytes);
          if constexpr (kCluster > 1) {
            // mc2: the shared panel as this CTA's slice, multicast to both CTAs (I2, I3).
            load_panels_mc2<T>(p, u.kind, l, ti, tj, kt, state.index, sA, sB, &smem.full[state.index], tAgA, tAsA,
                               tBgB, tBsB);
          } else {
            copy(p.tma_a.with(smem.full[state.index]), tAgA(_, kt), tAsA(_, state.index));
            copy(p.tma_b.with(smem.full[state.index]), tBgB(_, kt), tBsB(_, state.index));
          }
          state.advance();
          // tmastore with β·C: the C tile into the epilogue tile once the last stores read it.
          // NOTE: mc2: not for a tile this CTA only shadows (its epilogue is skipped too, I6).
          // Split-K: for every slice (which one finishes last is not known yet).
          if constexpr (T::kTmaStore && !T::kWide) {
            if (with_c && kt == c_kt && u.writes) {
              EmptyBarrier::wait(&smem.epi_empty, epi_phase);
              epi_phase ^= 1u;
              Tensor sC = make_tensor(make_smem_ptr(smem.tile), typename T::EpiLayout{});  // (kTile, kTile)
              Tensor mC = p.tma_c.get_tma_tensor(make_shape(p.m, p.m, p.batch));          // (m, m, batch) coords
              Tensor gC = local_tile(mC(_, _, l), tile_mm, make_coord(ti, tj));            // (kTile, kTile)
              auto [tCgC, tCsC] = tma_partition(p.tma_c, group_modes<0, 2>(sC), group_modes<0, 2>(gC));
              FullBarrier::arrive_and_expect_tx(&smem.c_full, T::kTileBytes);
              copy(p.tma_c.with(smem.c_full), tCgC, tCsC);
            }
          }
        }
        // Wide tmastore with β·C: the C tile of each column tile of the unit as one more
        // stage use of the ring, after the unit's k-tiles (both CTAs of a cluster, lockstep I1).
        if constexpr (T::kWide) {
          if (with_c) load_c_slots<T>(p, u, smem, state);
        }
      }
    }
    // mc2: no early exit (I5): the producer warpgroup joins the final cluster_sync.
    if constexpr (kCluster > 1) {
      __syncwarp();
      cute::cluster_sync();
    }
    return;
  }

  // Consumers: WGMMA over the ring, then the epilogue.
  cutlass::arch::warpgroup_reg_alloc<232>();
  typename T::TiledMma mma;
  const int consumer_idx = threadIdx.x - 128;
  auto thr_mma = mma.get_thread_slice(consumer_idx);
  Tensor tCsA = thr_mma.partition_A(sA);              // (MMA, MMA_M, MMA_K, kStages)
  Tensor tCsB = thr_mma.partition_B(sB);              // (MMA, MMA_N, MMA_K, kStages)
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);        // smem descriptors
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);        // smem descriptors
  // NOTE: n256: accumulators [kTileValues·h, kTileValues·(h + 1)) are column tile h of the
  // unit (checked on the host: fragment_tiles_split_by_column, before the first launch).
  Tensor cD = make_identity_tensor(make_shape(Int<kTile>{}, Int<kTileN>{}));  // (kTile, kTileN) → (r, c)
  Tensor tCcD = thr_mma.partition_C(cD);              // (MMA, MMA_M, MMA_N) coords
  Tensor acc = partition_fragment_C(mma, make_shape(Int<kTile>{}, Int<kTileN>{}));  // (MMA, MMA_M, MMA_N) fp32

  RingState<kStages> state{0, 0u};
  bool store_pending = false;  // tmastore, consumer 0: TMA stores in flight from the epilogue tiles
  int epi_seq = 0;             // wide tmastore: subtiles written so far (picks the buffer pair)
  uint32_t c_phase = 0u;       // tmastore: parity of the next C load
  for (int64_t w = work_begin; w < p.num_work; w += work_step) {
    const WorkUnit u = decode_work<T>(p, w, num_k_tiles);
    const int l = u.l, ti = u.ti;
    [[maybe_unused]] const int release_at = release_kt(u);

    // Main loop: keep one WGMMA batch in flight; free a stage once its batch retired.
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    int prev_stage = -1;
    for (int kt = u.k_begin; kt < u.k_end; ++kt) {
      FullBarrier::wait(&smem.full[state.index], state.phase);
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(mma, tCrA(_, _, kb, state.index), tCrB(_, _, kb, state.index), acc);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
      if (prev_stage >= 0) release_stage<T>(smem.empty, prev_stage);
      prev_stage = state.index;
      state.advance();
      // tmastore: once the last tile's stores have read the epilogue tiles, free them.
      if constexpr (T::kTmaStore && !T::kWide) {
        if (kt == release_at) {
          if (store_pending) {
            tma_store_wait<0>();
            EmptyBarrier::arrive(&smem.epi_empty);
            store_pending = false;
          }
          __syncwarp();  // NOTE: warp 0 converged again before the next (aligned) WGMMA
        }
      }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    release_stage<T>(smem.empty, prev_stage);
    // Wide tmastore: its own epilogue, which also takes the C stage uses (writing or not).
    // Split-K: a slice first publishes its accumulators; only the tile's last slice writes
    // (a shadow unit's rank 1 neither writes nor counts).
    if constexpr (T::kWide) {
      bool writes = u.writes;
      if constexpr (T::kCanSplit) {
        if (u.part >= 0 && u.writes) writes = split_k_reduce<T>(p, u, consumer_idx, acc, &smem.split_last);
      }
      wide_tmastore_epilogue<T>(p, u, with_c, writes, consumer_idx, acc, smem, state, store_pending, epi_seq);
      continue;
    }
    // mc2: rank 1 of a shadow unit only kept the barrier protocol going (I6).
    if constexpr (kCluster > 1) {
      if (!u.writes) continue;
    }
    // Split-K: publish this slice; the tile's last slice to finish sums them and goes on.
    // NOTE: compiled into the instances that can split only (Traits::kCanSplit; the wide one
    // split above).
    if constexpr (T::kCanSplit) {
      if (u.part >= 0) {
        if (!split_k_reduce<T>(p, u, consumer_idx, acc, &smem.split_last)) {
          // NOTE: the producer loaded C for this slice too; take the load (parity) and free
          // the epilogue tile for the next one (one epi_empty arrival per C load).
          if (with_c) {
            FullBarrier::wait(&smem.c_full, c_phase);
            c_phase ^= 1u;
            if (consumer_idx == 0) EmptyBarrier::arrive(&smem.epi_empty);
          }
          continue;
        }
      }
    }

    // The unit's output tiles: column tile tj = u.tj·kColTiles + h of row tile ti, from
    // accumulators [kTileValues·h, kTileValues·(h + 1)). n256: a unit's second tile above the
    // diagonal (column tile ti + 1) is skipped; its values are the mirror of another tile's.
    // NOTE: compile-time loops over h, so that every accumulator index stays a constant
    // (registers, not local memory).
    Elem* d = p.d + l * p.stride_d;
    const Elem* c = p.beta != 0.f ? p.c + l * p.stride_c : nullptr;
    // NOTE: n256: the accumulators' coordinates are derived again in each unit. From tCcD
    // the compiler computed the 128 shared-memory offsets of the staged epilogue once, before
    // the work loop, and kept them across it (ptxas -v, nvcc 13: 828 bytes of spills).
    auto tEcD = [&] {
      if constexpr (T::kColTiles > 1) {
        return mma.get_thread_slice(opaque(consumer_idx)).partition_C(cD);  // (MMA, MMA_M, MMA_N) coords
      } else {
        return tCcD;
      }
    }();
    auto each_tile = [&](auto&& body) {
      cute::for_each(make_int_sequence<T::kColTiles>{}, [&](auto h) {
        const int tj = u.tj * T::kColTiles + decltype(h)::value;
        if (T::kColTiles == 1 || tj <= ti) body(h, tj);
      });
    };

    if constexpr (T::kWide) {
      // (its epilogue ran above)
    } else if constexpr (T::kTmaStore) {
      const int tj = u.tj;
      const bool diagonal = ti == tj;
      // tmastore epilogue, pass 1: α·acc + β·C in fp32 (C from the tile the producer
      // loaded), rounded once, into the tile and its transpose into the mirror. A diagonal
      // tile takes its lower triangle's values in both halves and has no mirror.
      Tensor sT = make_tensor(make_smem_ptr(smem.tile), typename T::EpiLayout{});    // (kTile, kTile)
      Tensor sM = make_tensor(make_smem_ptr(smem.mirror), typename T::EpiLayout{});  // (kTile, kTile)
      Elem* tile = smem.tile;      // [kTile, kTile] at tma_tile_index (= sT's layout)
      Elem* mirror = smem.mirror;  // [kTile, kTile] at tma_tile_index (= sM's layout)
      if (with_c) {
        FullBarrier::wait(&smem.c_full, c_phase);
        c_phase ^= 1u;
      }
      consumer_barrier();  // NOTE: without C, orders these writes after the release above
      // In 8×8 blocks (see load_blocks_x4), four an instruction: warp w holds rows 16w …
      // 16w + 15, and accumulator pair 8·jj + 2·q (q = 0…3) is the block at rows
      // 16w + 8·(q%2) …, columns 8·(2·jj + q/2) …. Each block goes to the tile in place
      // of C and transposed to the mirror; a warp reads and writes only its own rows of the
      // tile.
      const int warp = consumer_idx / 32, lane = consumer_idx % 32;
      const int quad = lane / 8, sub = lane % 8;  // the block this lane addresses, and its row
      const int row = 16 * warp + 8 * (quad % 2) + sub;
      CUTE_UNROLL
      for (int jj = 0; jj < 8; ++jj) {
        const int col = 8 * (2 * jj + quad / 2);
        Elem* at = tile + tma_tile_index(row, col);
        uint32_t c_pairs[4] = {0u, 0u, 0u, 0u}, out[4];
        if (with_c) load_blocks_x4(at, c_pairs);
        CUTE_UNROLL
        for (int q = 0; q < 4; ++q) {
          float lo = p.alpha * acc(8 * jj + 2 * q), hi = p.alpha * acc(8 * jj + 2 * q + 1);
          if (with_c) {
            lo += p.beta * low_of<Elem>(c_pairs[q]);
            hi += p.beta * high_of<Elem>(c_pairs[q]);
          }
          out[q] = pack_pair<Elem>(lo, hi);
        }
        store_blocks_x4(at, out);
        store_blocks_x4_transposed(mirror + tma_tile_index(col + sub, 16 * warp + 8 * (quad % 2)), out);
      }
      // A diagonal tile takes its lower triangle's values in both halves: above the
      // diagonal, (r, c) becomes mirror (r, c), the value computed for (c, r). The mirror is
      // not stored. 16-byte chunks; a chunk the diagonal cuts is merged element by element.
      // NOTE: per element, the lower values would need 32 single-block instructions with
      // branches: ptxas then spilled 1.4 KiB (nvcc 13, 2026-11-30).
      if (diagonal) {
        consumer_barrier();  // NOTE: every warp's mirror blocks are written
        constexpr int kChunks = kTile * kTile / 8;
        for (int q = consumer_idx; q < kChunks; q += T::kNumConsumerThreads) {
          const int r = q / (kTile / 8), c0 = 8 * (q % (kTile / 8));
          if (c0 + 7 <= r) continue;  // no element above the diagonal
          take_above_diagonal(reinterpret_cast<uint4*>(tile + tma_tile_index(r, c0)),
                              reinterpret_cast<const uint4*>(mirror + tma_tile_index(r, c0)), r, c0);
        }
      }
      tma_store_fence();  // the generic-proxy writes, visible to the TMA unit
      consumer_barrier();

      // Pass 2: one thread stores the tile and the mirror (clipped at m × m) and moves on.
      if (consumer_idx == 0) {
        Tensor mD = p.tma_d.get_tma_tensor(make_shape(p.m, p.m, p.batch));  // (m, m, batch) coords
        Tensor gD = local_tile(mD(_, _, l), tile_mm, make_coord(ti, tj));    // (kTile, kTile)
        auto [tDgD, tDsT] = tma_partition(p.tma_d, group_modes<0, 2>(sT), group_modes<0, 2>(gD));
        copy(p.tma_d, tDsT, tDgD);
        if (!diagonal) {
          Tensor gM = local_tile(mD(_, _, l), tile_mm, make_coord(tj, ti));  // (kTile, kTile)
          auto [tMgM, tMsM] = tma_partition(p.tma_d, group_modes<0, 2>(sM), group_modes<0, 2>(gM));
          copy(p.tma_d, tMsM, tMgM);
        }
        tma_store_arrive();
        store_pending = true;
      }
      __syncwarp();
    } else if constexpr (!T::kStaged) {
      // Direct epilogue: α·acc + β·C in fp32, one rounding, tile and mirror.
      each_tile([&](auto h, int tj) {
        constexpr int kOff = decltype(h)::value * T::kTileValues, kColOff = decltype(h)::value * kTile;
        const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
        const bool diagonal = ti == tj;
        CUTE_UNROLL
        for (int i = 0; i < T::kTileValues; ++i) {
          const int64_t r = row0 + get<0>(tEcD(kOff + i)), col = col0 + get<1>(tEcD(kOff + i)) - kColOff;
          if (r >= p.m || col >= p.m || (diagonal && r < col)) continue;
          float v = p.alpha * acc(kOff + i);
          if (c != nullptr) v += p.beta * static_cast<float>(c[r * p.ldc + col]);
          const Elem e = static_cast<Elem>(v);
          d[r * p.ldd + col] = e;
          if (r != col) d[col * p.ldd + r] = e;
        }
      });
    } else {
      // Staged epilogue, pass 1: every tile of the unit, rounded α·acc + β·C, into shared
      // memory (n256: both at once, so that no accumulator stays live through passes 2–3).
      consumer_barrier();  // NOTE: the previous unit's passes 2–3 are done reading
      each_tile([&](auto h, int tj) {
        constexpr int kOff = decltype(h)::value * T::kTileValues, kColOff = decltype(h)::value * kTile;
        Elem* tile = smem.epilogue + decltype(h)::value * kTile * kTile;  // [kTile, kTile] swizzled
        const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
        CUTE_UNROLL
        for (int i = 0; i < T::kTileValues; ++i) {
          const int tr = get<0>(tEcD(kOff + i)), tc = get<1>(tEcD(kOff + i)) - kColOff;
          const int64_t r = row0 + tr, col = col0 + tc;
          float v = p.alpha * acc(kOff + i);
          if (c != nullptr && r < p.m && col < p.m) v += p.beta * static_cast<float>(c[r * p.ldc + col]);
          tile[epilogue_index(tr, tc)] = static_cast<Elem>(v);
        }
      });
      consumer_barrier();

      each_tile([&](auto h, int tj) {
        const Elem* tile = smem.epilogue + decltype(h)::value * kTile * kTile;  // [kTile, kTile] swizzled
        const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
        const bool diagonal = ti == tj;
        // Pass 2: rows of the tile, 16 bytes per thread and step (coalesced). On a diagonal
        // tile, (r, c) with r < c takes the value computed for (c, r).
        constexpr int kChunks = kTile * kTile / 8;  // 2048 chunks of 8 elements
        for (int q = consumer_idx; q < kChunks; q += T::kNumConsumerThreads) {
          const int tr = q >> 4, tc = (q & 15) << 3;
          const int64_t r = row0 + tr, col = col0 + tc;
          if (r >= p.m || col >= p.m) continue;
          Elem* out = d + r * p.ldd + col;
          if (!diagonal && col + 8 <= p.m) {
            *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(tile + epilogue_index(tr, tc));
          } else {
            for (int e = 0; e < 8 && col + e < p.m; ++e) {
              const int cc = tc + e;
              out[e] = (diagonal && tr < cc) ? tile[epilogue_index(cc, tr)] : tile[epilogue_index(tr, cc)];
            }
          }
        }
        // Pass 3 (off-diagonal tiles): the mirror, D[col0 + c][row0 + r…r+7] = tile[r…r+7][c].
        if (!diagonal) {
          for (int q = consumer_idx; q < kChunks; q += T::kNumConsumerThreads) {
            const int tc = q >> 4, tr = (q & 15) << 3;
            const int64_t mr = col0 + tc, mc = row0 + tr;  // mirror row / first mirror column
            if (mr >= p.m || mc >= p.m) continue;
            // NOTE: gathered as raw 16-bit values packed into one uint4 (an Elem array
            // indexed through a pointer cast would live in local memory).
            const uint16_t* raw = reinterpret_cast<const uint16_t*>(tile);
            auto pair = [&](int e) {
              return static_cast<uint32_t>(raw[epilogue_index(tr + e, tc)]) |
                     (static_cast<uint32_t>(raw[epilogue_index(tr + e + 1, tc)]) << 16);
            };
            const uint4 packed = make_uint4(pair(0), pair(2), pair(4), pair(6));
            Elem* out = d + mr * p.ldd + mc;
            if (mc + 8 <= p.m) {
              *reinterpret_cast<uint4*>(out) = packed;
            } else {
              const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
              uint16_t* out_raw = reinterpret_cast<uint16_t*>(out);
              CUTE_UNROLL
              for (int e = 0; e < 8; ++e)
                if (mc + e < p.m) out_raw[e] = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
            }
          }
        }
      });
    }
  }
  // tmastore: shared memory must outlive the last TMA stores' reads.
  if constexpr (T::kTmaStore) {
    if (store_pending) tma_store_wait<0>();
  }
  // mc2: no CTA exits while its peer may still arrive on its barriers (I5).
  if constexpr (kCluster > 1) {
    __syncwarp();
    cute::cluster_sync();
  }
#endif
}

// Host launch of one instance. Requirements are checked by the caller (sym_config_applies).
// Split-K shape of a launch: slices of at least kMinSliceKTiles k-tiles, at most kMaxSplit
// slices a tile.
// NOTE: the last slice reads the other split − 1 partial tiles (64 KiB each) from L2 on one
// SM while every slice's mainloop shrinks as 1/split; for 3584×18944 (296 k-tiles, 10 tail
// tiles on 132 SMs) an estimate (not a measurement) puts the smallest sum of both near 12
// slices, hence the cap of 16.
constexpr int kMinSliceKTiles = 4;
constexpr int kMaxSplit = 16;

// The split of `tail` units of which `wave` run at once: as many slices as fit in one round
// (tail·split ≤ wave), at most kMaxSplit, slices of at least kMinSliceKTiles k-tiles.
// NOTE: one round only. Several rounds of slices, where they would cut the tail's time on
// paper (39 pairs of 128×256 units on 66 clusters, 3584 × 18944 b1: 3 slices in 2 rounds,
// 0.67 of a unit against 1.0 whole), ran slower than no split (0.5222 against 0.4697 ms; H200,
// 2026-11-30, BENCHMARKS.md run K): under the power limit a partly idle last wave runs
// faster clocks, so its idle part costs less than its share of the time.
inline int64_t choose_tail_split(int64_t tail, int64_t wave, int num_k_tiles) {
  return std::max<int64_t>(std::min<int64_t>({wave / tail, num_k_tiles / kMinSliceKTiles, kMaxSplit}), 1);
}

// Host checks of CuTe's accumulator layout (evaluated on the host, before the first launch):
// whether every consumer thread holds `values` accumulators of a kTile × kTileN unit and
// ok(thread, v, row, col) holds for each accumulator v at (row, col) of the unit.
// NOTE: the threads are those of T::TiledMma (both consumer warpgroups).
template <class T, class Ok>
bool every_accumulator(int values, Ok ok) {
  typename T::TiledMma mma;
  for (int thread = 0; thread < static_cast<int>(size(mma)); ++thread) {
    Tensor coords = mma.get_thread_slice(thread).partition_C(
        make_identity_tensor(make_shape(Int<T::kTile>{}, Int<T::kTileN>{})));
    if (size(coords) != values) return false;
    for (int v = 0; v < size(coords); ++v)
      if (!ok(thread, v, static_cast<int>(get<0>(coords(v))), static_cast<int>(get<1>(coords(v))))) return false;
  }
  return true;
}

// n256: whether accumulators [kTileValues·h, kTileValues·(h + 1)) of every consumer thread
// hold exactly column tile h of the unit (the epilogue's assumption).
template <class T>
bool fragment_tiles_split_by_column() {
  return every_accumulator<T>(T::kColTiles * T::kTileValues,
                              [](int, int v, int, int col) { return col / T::kTile == v / T::kTileValues; });
}

// tmastore: whether every consumer thread's accumulators are in the mma fragment layout
// that the block epilogues assume (value v: row 16·warp + 8·((v/2)%2) + lane/4, column
// 8·(v/4) + 2·(lane%4) + v%2; a 128×256 unit's columns continue to 255).
template <class T>
bool fragment_is_mma_layout() {
  return every_accumulator<T>(T::kColTiles * T::kTileValues, [](int thread, int v, int row, int col) {
    const int warp = thread / 32, lane = thread % 32;
    return row == 16 * warp + 8 * ((v / 2) % 2) + lane / 4 && col == 8 * (v / 4) + 2 * (lane % 4) + v % 2;
  });
}

// The kernel parameters of a 1-CTA launch over every unit, no split (launch adds the mc2
// pair list and the split-K tail): operand views, the triangle's units, tmastore's D and C.
template <class T>
typename T::Params make_params(const SymProductArgs& args) {
  using Elem = typename T::Element;
  typename T::Params p{
      T::tma(static_cast<const Elem*>(args.a), static_cast<int>(args.m), static_cast<int>(args.k),
             static_cast<int>(args.batch), args.lda, args.stride_a),
      T::tma_b(static_cast<const Elem*>(args.b), static_cast<int>(args.m), static_cast<int>(args.k),
               static_cast<int>(args.batch), args.ldb, args.stride_b),
      {}, {},
      static_cast<int>(args.m), static_cast<int>(args.k), static_cast<int>(args.batch), 0, 0, 0,
      static_cast<const Elem*>(args.c), args.ldc, args.stride_c, static_cast<Elem*>(args.d), args.ldd,
      args.stride_d, static_cast<float>(args.alpha), static_cast<float>(args.beta), {}, {}, {},
      0, 1, nullptr, nullptr};
  p.num_row_tiles = static_cast<int>((args.m + T::kTile - 1) / T::kTile);
  // Units per matrix: lower-triangle tiles, or (n256) 128×256 units over them.
  p.num_tri = T::kColTiles == 1 ? static_cast<int64_t>(p.num_row_tiles) * (p.num_row_tiles + 1) / 2
                                : wide_units(p.num_row_tiles);
  p.num_work = p.num_tri * args.batch;
  p.num_full = p.num_work;
  if constexpr (T::kTmaStore) {
    const int m = static_cast<int>(args.m), batch = static_cast<int>(args.batch);
    if constexpr (!T::kWide) p.tma_d = T::tma_store_d(static_cast<Elem*>(args.d), m, batch, args.ldd, args.stride_d);
    // NOTE: without C the C view is D's (a valid descriptor that the kernel never loads).
    const bool with_c = args.beta != 0.0 && args.c != nullptr;
    if constexpr (T::kWide) {
      // NOTE: C (m × m) in the A panel's 128×64 boxes; D in 64×64 boxes.
      p.tma_d = T::tma_store_sub(static_cast<Elem*>(args.d), m, batch, args.ldd, args.stride_d);
      p.tma_c = with_c ? T::tma(static_cast<const Elem*>(args.c), m, m, batch, args.ldc, args.stride_c)
                       : T::tma(static_cast<const Elem*>(args.d), m, m, batch, args.ldd, args.stride_d);
    } else {
      p.tma_c = with_c ? T::tma_load_c(static_cast<const Elem*>(args.c), m, batch, args.ldc, args.stride_c)
                       : T::tma_load_c(static_cast<const Elem*>(args.d), m, batch, args.ldd, args.stride_d);
    }
  }
  return p;
}

// Raises the dynamic shared-memory limit of `kernel` to `bytes` on `device`, once per kernel
// and device. NOTE: a per-device function attribute; keyed by the kernel's address, since
// instances with the same parameter type share a function-pointer type.
inline void opt_in_shared_memory(const void* kernel, int bytes, int device) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.emplace(device, kernel).second)
    DMUON_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class Elem, int kStages, int kEpi, int kCluster = 1, int kTileN = 128>
void launch(const SymProductArgs& args, int num_ctas, bool split_k, cudaStream_t stream) {
  using T = Traits<Elem, kStages, kEpi, kCluster, kTileN>;
  if constexpr (T::kColTiles > 1) {
    static const bool split_by_column = fragment_tiles_split_by_column<T>();
    DMUON_CHECK(split_by_column, "sm90_sym_product: the 128x", kTileN,
                " accumulator fragment is not split by column tile (CuTe layout changed?)");
  }
  if constexpr (T::kTmaStore) {
    static const bool mma_layout = fragment_is_mma_layout<T>();
    DMUON_CHECK(mma_layout, "sm90_sym_product: the accumulator fragment is not the mma layout the tmastore "
                            "epilogue assumes (CuTe layout changed?)");
  }
  typename T::Params p = make_params<T>(args);
  if constexpr (kCluster > 1) {
    const int m = static_cast<int>(args.m), k = static_cast<int>(args.k), batch = static_cast<int>(args.batch);
    p.tma_am = T::tma_mc(static_cast<const Elem*>(args.a), m, k, batch, args.lda, args.stride_a);
    p.tma_bm = T::tma_mc_b(static_cast<const Elem*>(args.b), m, k, batch, args.ldb, args.stride_b);
    p.pairs = T::kColTiles == 2 ? make_wide_pair_list(p.num_row_tiles, batch) : make_pair_list(p.num_row_tiles, batch);
    p.num_work = p.pairs.num_units;  // NOTE: mc2 works on pairs of tiles
    p.num_full = p.num_work;
  }

  // Launch: persistent grid of min(work, CTAs) CTAs, one per SM (mc2: whole clusters).
  auto kernel = sym_product_kernel<Elem, kStages, kEpi, kCluster, kTileN>;
  static_assert(sizeof(typename T::SharedStorage) <= 227 * 1024, "over the 227 KiB shared-memory opt-in");
  const int smem_bytes = static_cast<int>(sizeof(typename T::SharedStorage));
  int device = 0, num_sms = 0;
  DMUON_CHECK_CUDA(cudaGetDevice(&device));
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, device);
  DMUON_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t ctas = num_ctas > 0 ? std::min<int64_t>(num_ctas, num_sms) : num_sms;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute[1];
  // One wave: the units that run at once (CTAs; mc2: clusters, each running one pair).
  int64_t wave = ctas;
  if constexpr (kCluster > 1) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = kCluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    config.blockDim = dim3(T::kNumThreads, 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    // NOTE: one CTA per SM and clusters confined to a GPC: with GPCs of odd SM counts
    // fewer than num_sms / 2 clusters fit. Asked once per device (the attribute set above
    // comes first: the occupancy query sees the opt-in).
    static std::mutex mutex;
    static std::map<int, int> fitting_clusters;
    int max_clusters = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = fitting_clusters.find(device);
      if (it == fitting_clusters.end()) {
        config.gridDim = dim3(static_cast<unsigned>(num_sms / kCluster * kCluster), 1, 1);
        DMUON_CHECK_CUDA(cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config));
        it = fitting_clusters.emplace(device, max_clusters).first;
      }
      max_clusters = it->second;
    }
    DMUON_CHECK(max_clusters > 0, "sm90_sym_product: no 2-CTA cluster of this kernel fits on device ", device);
    wave = std::max<int64_t>(std::min<int64_t>(ctas / kCluster, max_clusters), 1);
  }
  // Split-K: whole waves of units as they are, the tail units cut into k-slices (header).
  if (split_k) {
    DMUON_CHECK(T::kCanSplit, "sm90_sym_product: this instance has no split-K");
    const int num_k_tiles = (p.k + T::kTileK - 1) / T::kTileK;
    const int64_t full = p.num_work / wave * wave, tail = p.num_work - full;
    DMUON_CHECK(args.scratch != nullptr &&
                    args.scratch_bytes >= sm90_sym_split_scratch_bytes(static_cast<int>(ctas), T::kTileN),
                "sm90_sym_product: split-K scratch too small");
    // NOTE: at most `wave` slices of tail units, so at most ctas partial units (mc2: two a pair).
    const int64_t split = tail == 0 ? 1 : choose_tail_split(tail, wave, num_k_tiles);
    if (split >= 2) {
      p.num_full = full;
      p.split = static_cast<int>(split);
      p.num_work = full + tail * split;
      p.counters = static_cast<int*>(args.scratch);
      p.partials = reinterpret_cast<float*>(static_cast<char*>(args.scratch) +
                                            sm90_sym_split_counter_bytes(static_cast<int>(ctas)));
      DMUON_CHECK_CUDA(
          cudaMemsetAsync(p.counters, 0, static_cast<size_t>(tail * kCluster) * sizeof(int), stream));
    }
  }
  if constexpr (kCluster == 1) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.num_work, ctas));
    kernel<<<grid, T::kNumThreads, smem_bytes, stream>>>(p);
  } else {
    // mc2 launch: a persistent grid of whole clusters (2 × 1 × 1), no more than fit at once.
    const int64_t clusters = std::min<int64_t>(p.num_work, wave);
    config.gridDim = dim3(static_cast<unsigned>(std::max<int64_t>(clusters, 1) * kCluster), 1, 1);
    DMUON_CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, p));
  }
  DMUON_CHECK_CUDA(cudaGetLastError());
}

// Every built (stages, epilogue, cluster) instance of one element type; false when not built.
template <class Elem>
bool launch_instance(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  constexpr int kDirect = static_cast<int>(Sm90Epilogue::kDirect);
  constexpr int kStaged = static_cast<int>(Sm90Epilogue::kStaged);
  constexpr int kTmaStore = static_cast<int>(Sm90Epilogue::kTmaStore);
  // mc2 (2-CTA clusters; which are autotuner candidates: sm90_sym_config.cpp).
  if (config.cluster == 2) {
    // Wide tmastore (128×256 units), s4 (one subtile buffer pair) and s3 (two).
    if (config.tile_n == 256) {
      if (config.epilogue != Sm90Epilogue::kTmaStore) return false;
      if (config.stages == 4) {
        launch<Elem, 4, kTmaStore, 2, 256>(args, config.num_ctas, config.split_k, stream);
      } else if (config.stages == 3) {
        launch<Elem, 3, kTmaStore, 2, 256>(args, config.num_ctas, config.split_k, stream);
      } else {
        return false;
      }
      return true;
    }
    if (config.tile_n != 128 || (config.split_k && config.epilogue != Sm90Epilogue::kTmaStore)) return false;
    switch (config.stages * 4 + static_cast<int>(config.epilogue)) {
      case 4 * 4 + kTmaStore: launch<Elem, 4, kTmaStore, 2>(args, config.num_ctas, config.split_k, stream); return true;
      case 5 * 4 + kTmaStore: launch<Elem, 5, kTmaStore, 2>(args, config.num_ctas, config.split_k, stream); return true;
      case 6 * 4 + kStaged: launch<Elem, 6, kStaged, 2>(args, config.num_ctas, config.split_k, stream); return true;
      default: return false;
    }
  }
  if (config.cluster != 1) return false;
  // n256 (128×256 units; which are candidates: sm90_sym_config.cpp).
  if (config.tile_n == 256) {
    if (config.split_k) return false;
    switch (config.stages * 4 + static_cast<int>(config.epilogue)) {
      case 3 * 4 + kStaged: launch<Elem, 3, kStaged, 1, 256>(args, config.num_ctas, false, stream); return true;
      case 3 * 4 + kDirect: launch<Elem, 3, kDirect, 1, 256>(args, config.num_ctas, false, stream); return true;
      case 4 * 4 + kDirect: launch<Elem, 4, kDirect, 1, 256>(args, config.num_ctas, false, stream); return true;
      case 4 * 4 + kTmaStore: launch<Elem, 4, kTmaStore, 1, 256>(args, config.num_ctas, false, stream); return true;
      case 3 * 4 + kTmaStore: launch<Elem, 3, kTmaStore, 1, 256>(args, config.num_ctas, false, stream); return true;
      default: return false;
    }
  }
  if (config.tile_n != 128) return false;
  switch (config.stages * 4 + static_cast<int>(config.epilogue)) {
    case 4 * 4 + kDirect: launch<Elem, 4, kDirect>(args, config.num_ctas, config.split_k, stream); return true;
    case 5 * 4 + kDirect: launch<Elem, 5, kDirect>(args, config.num_ctas, config.split_k, stream); return true;
    case 6 * 4 + kDirect: launch<Elem, 6, kDirect>(args, config.num_ctas, config.split_k, stream); return true;
    case 4 * 4 + kStaged: launch<Elem, 4, kStaged>(args, config.num_ctas, config.split_k, stream); return true;
    case 5 * 4 + kStaged: launch<Elem, 5, kStaged>(args, config.num_ctas, config.split_k, stream); return true;
    case 6 * 4 + kStaged: launch<Elem, 6, kStaged>(args, config.num_ctas, config.split_k, stream); return true;
    case 4 * 4 + kTmaStore: launch<Elem, 4, kTmaStore>(args, config.num_ctas, config.split_k, stream); return true;
    case 5 * 4 + kTmaStore: launch<Elem, 5, kTmaStore>(args, config.num_ctas, config.split_k, stream); return true;
    default: return false;
  }
}

}  // namespace dmuon::ns::cuda::sm90
