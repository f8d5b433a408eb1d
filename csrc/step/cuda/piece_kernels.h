// dmuon/step/cuda/piece_kernels.h — the step's fused passes over lists of row pieces on
// CUDA (torch-free): ns/cuda/matrix_list.h's passes generalized from whole fp32 matrices
// to row pieces of float32 / bfloat16 / float16 parameters and a wire dtype.
//
//   check             grad, momentum → NaN/Inf flags; partial sums of U² (whole items)
//   fingerprint       pieces' bits → one uint64 sum (step/fingerprint.h)
//   prepare           momentum in place, U rows → the wire send buffer
//   sum_squares       wire pieces → partial sums of their squares
//   scales            partials → 1 / max(√Σ, eps) per matrix, in a fixed order
//   local_to_iterate  momentum and U/‖U‖ of whole local items → the 16-bit iterate
//   pieces_to_iterate wire pieces · scale → the 16-bit iterate (transposed when tall)
//   result_to_pieces  16-bit result rows (wide orientation) → wire pieces
//   apply_result      p ← p·decay + scale·O from the result (this rank's own rows)
//   apply_wire        the same from returned wire pieces
//   copy              pieces copied, strided on either side (DeviceOps::copy)
// Element semantics are the CPU ops' (step/cpu/cpu_ops.h): float arithmetic, the momentum
// rounded to the parameter dtype after its lerp, U rounded to it, O rounded to it before
// the apply. Every writing pass honours `skip` (device int, may be null): non-zero at run
// time writes nothing, and the iterate passes write zeros. Descriptors travel in the
// kernels' parameters, kMaxPiecesPerLaunch per launch. Parameter-side memory (gradient,
// momentum, parameter) may be strided, a column block's rows in the local tensor: the
// descriptors carry its row length and stride; wires and iterates are always contiguous.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/host_device.h"
#include "step/types.h"

namespace dmuon::step::cuda {

/// Pieces (or matrices) per launch: their descriptors travel in the kernel parameters.
/// NOTE: 32 descriptors of at most 80 bytes stay inside the classic 4 KiB parameter limit.
inline constexpr int kMaxPiecesPerLaunch = 32;
/// Elements per partial sum (one block each).
/// NOTE: 16384 keeps Qwen2.5-7B's largest matrix (3584 × 18944) at 4144 partials, which the
/// reduction reads in a few microseconds, and still gives thousands of blocks per batch.
inline constexpr int64_t kPartialChunk = 16384;
/// Partial sums of a piece of `numel` elements (at least 1).
int64_t num_chunks(int64_t numel);

/// The momentum rule as the kernels see it (float weights, as torch casts its Scalars).
struct Rule {
  float buffer_weight = 0.05f;    ///< 1 − μ
  float nesterov_weight = 0.95f;  ///< μ
  int nesterov = 1;
};
Rule make_rule(double momentum, bool nesterov);

struct CheckDesc {
  const void* grad = nullptr;
  const void* momentum = nullptr;
  int64_t numel = 0;
  Rule rule;
  int flag_idx = 0;
  int64_t partial_offset = -1;  ///< −1: no partials
  int64_t row_len = 0, ld = 0;  ///< grad and momentum strided (step::Buffer::strided), else 0
};
/// flags[2·flag_idx] |= gradient non-finite, [2·flag_idx + 1] |= momentum non-finite;
/// partials[partial_offset + chunk] = Σ U² over the chunk. `param` may also be float64 for
/// pieces without partials (gradients the step only checks).
void check(DType param, const std::vector<CheckDesc>& pieces, int* flags, float* partials, cudaStream_t stream);

/// A piece's elements of `width` bytes (2, 4 or 8), hashed with `key` (step/fingerprint.h).
struct FingerprintDesc {
  const void* data = nullptr;
  int64_t numel = 0;
  uint64_t key = 0;
  int64_t row_len = 0, ld = 0;  ///< strided (step::Buffer::strided), else 0
};
/// *sum += Σ fingerprint_term over every element of `pieces`, all of `width` bytes.
void fingerprint(int width, const std::vector<FingerprintDesc>& pieces, unsigned long long* sum, cudaStream_t stream);

struct PrepareDesc {
  const void* grad = nullptr;
  void* momentum = nullptr;
  void* wire = nullptr;  ///< null: momentum only
  int64_t numel = 0;
  Rule rule;
  int64_t row_len = 0, ld = 0;  ///< grad and momentum strided (the wire is contiguous), else 0
};
void prepare(DType param, DType wire, const std::vector<PrepareDesc>& pieces, const int* skip, cudaStream_t stream);

/// Rows [row_begin, row_begin + row_count) × columns [col_begin, col_begin + col_count) of
/// matrix `matrix_idx` ([row_count, col_count] row-major) in a wire buffer, with the first
/// of its num_chunks(row_count · col_count) partials at partial_offset.
struct WireDesc {
  void* wire = nullptr;
  int64_t matrix_idx = 0;
  int64_t row_begin = 0, row_count = 0;
  int64_t partial_offset = 0;
  int64_t col_begin = 0, col_count = 0;
};
void sum_squares(DType wire, const std::vector<WireDesc>& pieces, float* partials, cudaStream_t stream);

/// scales[k] = 1 / max(√Σ partials[offset[k] .. offset[k] + count[k]), eps), for k < count.
void scales(const float* partials, const std::vector<int64_t>& offset, const std::vector<int64_t>& count, double eps,
            float* scales_out, cudaStream_t stream);

/// The iterate of an NS batch: matrix k at data + k·stride, m×ld 16-bit (m = min(rows, cols));
/// `transposed` when rows > cols (item row r is iterate column r).
struct IterateView {
  void* data = nullptr;
  DType dtype = DType::kFloat16;
  int64_t rows = 0, cols = 0;  ///< of the items
  int64_t ld = 0, stride = 0;
  /// Results only: row factors applied as the result is read (step::NsView::row_scale).
  const float* row_scale = nullptr;
  const int* row_scaled = nullptr;
  bool transposed() const { return rows > cols; }
};
/// Zeros in the padding columns [max(rows, cols), ld) of every matrix of the iterate.
void zero_padding(const IterateView& iterate, int64_t count, cudaStream_t stream);

struct LocalDesc {
  const void* grad = nullptr;
  void* momentum = nullptr;
  int64_t matrix_idx = 0;
  Rule rule;
  int64_t ld = 0;  ///< grad and momentum rows this many elements apart (a column block); 0: cols
};
/// Iterate k = scales[k]·U of whole items (momentum updated first when update_momentum).
void local_to_iterate(DType param, const std::vector<LocalDesc>& matrices, bool update_momentum, const float* scales,
                      const IterateView& iterate, const int* skip, cudaStream_t stream);
/// Iterate rows (columns when transposed) of each piece = scales[matrix]·wire.
void pieces_to_iterate(DType wire, const std::vector<WireDesc>& pieces, const float* scales, const IterateView& iterate,
                       const int* skip, cudaStream_t stream);
/// Wire pieces = result rows (the iterate layout of `result`).
void result_to_pieces(DType wire, const IterateView& result, const std::vector<WireDesc>& pieces, cudaStream_t stream);

/// A block rows × [col_begin, col_begin + col_count) of a matrix (apply_result; its
/// parameter memory [row_count, col_count] contiguous), or row_count · cols wire elements
/// (apply_wire).
struct ApplyDesc {
  void* param = nullptr;
  const void* wire = nullptr;  ///< apply_wire only
  int64_t matrix_idx = 0;
  int64_t row_begin = 0, row_count = 0;
  float scale = 0.f, decay = 1.f;
  int flag_idx = 0;
  int64_t col_begin = 0, col_count = 0;  ///< apply_result only
  int64_t row_len = 0, ld = 0;           ///< param strided (step::Buffer::strided), else 0
  /// Elements between the parameter's rows (apply_result).
  DMUON_HOST_DEVICE int64_t param_row_stride() const { return ld > col_count ? ld : col_count; }
};
/// Whether apply_result moves these pieces with its vector kernels: parameter rows whole
/// runs of 4 at addresses aligned to them, result rows aligned for runs of 4 (runs of 8 of a
/// transposed result), a column block from a multiple of 4, a transposed piece from a row
/// multiple of 8. Else its scalar tiles (the same bits, slower).
bool apply_result_vectorizes(const IterateView& result, const ApplyDesc* pieces, int count, DType param);
/// p ← round(round(p·decay) + scale·O), O from the result rows (rounded to `round_wire`
/// first when it is not DType::kFloat64, the "no rounding" marker), then to the parameter
/// dtype; a non-finite O is not applied and sets flags[flag_idx].
void apply_result(DType param, DType round_wire, const IterateView& result, const std::vector<ApplyDesc>& pieces,
                  int* flags, const int* skip, cudaStream_t stream);
/// The same with O from each piece's wire (row_count · cols elements).
void apply_wire(DType param, DType wire, const std::vector<ApplyDesc>& pieces, int64_t cols, int* flags,
                const int* skip, cudaStream_t stream);

/// dst ← src in units of `unit_bytes` (1, 2, 4, 8 or 16; both aligned to it): `numel` units,
/// a side with row_len > 0 and ld > row_len is rows of row_len units ld apart.
struct CopyDesc {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t numel = 0;
  int64_t src_row_len = 0, src_ld = 0, dst_row_len = 0, dst_ld = 0;
};
void copy(int unit_bytes, const std::vector<CopyDesc>& pieces, cudaStream_t stream);

/// gate[0] = 1 when any of flags[0, n) is non-zero, else 0.
void any_nonzero(const int* flags, int64_t n, int* gate, cudaStream_t stream);

/// data[i] ← synthetic_value(seed, i) (step/synthetic.h) in `dtype`, for i < numel.
void fill_synthetic(DType dtype, void* data, int64_t numel, uint64_t seed, cudaStream_t stream);
/// dst ← scale · Σ_k src[k·numel …] (+ dst when `accumulate`), in float (double where
/// either side is float64), rounded once (DeviceOps::sum_into).
void sum_into(DType src_dtype, const void* src, int64_t num_parts, int64_t part_stride, DType dst_dtype, void* dst,
              int64_t numel,
              double scale, bool accumulate, cudaStream_t stream);

}  // namespace dmuon::step::cuda
