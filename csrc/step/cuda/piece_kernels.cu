// dmuon/step/cuda/piece_kernels.cu — the fused row-piece passes of the CUDA step ops.
#include "step/cuda/piece_kernels.h"

#include <algorithm>
#include <type_traits>

#include "common/check.h"
#include "ns/cuda/alignment.h"
#include "ns/cuda/cuda_check.h"
#include "step/cuda/kernel_common.cuh"
#include "step/fingerprint.h"
#include "step/synthetic.h"

namespace dmuon::step::cuda {
namespace {

// Tiles of the transposing passes: 32×32 elements, 32×8 threads (each thread 4 rows).
constexpr int kTile = 32;
constexpr int kTileRows = 8;

// O rounded to a wire dtype code (kRound*), the replicas' view of an owner's result.
enum RoundCode : int { kRoundNone = 0, kRoundBF16 = 1, kRoundF16 = 2 };
__device__ __forceinline__ float round_code(float v, int code) {
  if (code == kRoundBF16) return round_to<__nv_bfloat16>(v);
  if (code == kRoundF16) return round_to<__half>(v);
  return v;
}

// ATen's lerp (aten/src/ATen/native/Lerp.h), the arithmetic of torch's _foreach_lerp_.
__device__ __forceinline__ float lerp(float self, float end, float weight) {
  const float diff = end - self;
  return fabsf(weight) < 0.5f ? self + weight * diff : end - diff * (1.f - weight);
}

// The momentum after its lerp (written when `update`) and U, rounded to P.
template <typename P>
__device__ __forceinline__ float momentum_update(const P* grad, P* momentum, int64_t i, const Rule& rule, bool update) {
  const float g = load(grad, i);
  float m = load(momentum, i);
  if (update) {
    m = round_to<P>(lerp(m, g, rule.buffer_weight));
    momentum[i] = from_f<P>(m);
  }
  return rule.nesterov ? round_to<P>(lerp(g, m, rule.nesterov_weight)) : m;
}

// Sum over the block in a fixed order (warp trees, then warps in order): deterministic.
__device__ float block_sum(float value) {
  __shared__ float warp_sums[kThreads / 32];  // [warps]
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;  // valid in thread 0
}

unsigned flat_blocks(int64_t numel) {
  // NOTE: a grid-stride loop; 2048 blocks of 256 threads fill a 132-SM GPU several times.
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((numel + kThreads - 1) / kThreads, 2048)));
}

dim3 tile_grid(int64_t rows, int64_t cols, int n, int64_t tile_rows = kTile, int64_t tile_cols = kTile) {
  return dim3(static_cast<unsigned>(std::max<int64_t>(1, (cols + tile_cols - 1) / tile_cols)),
              static_cast<unsigned>(std::max<int64_t>(1, (rows + tile_rows - 1) / tile_rows)), static_cast<unsigned>(n));
}

// ---------------------------------------------------------------- tile movers
// One 32×32 tile (blockIdx.y, blockIdx.x) of an R×C piece, from read(r, c) to
// write(r, c, v). kTranspose: one side is coalesced along r, the other along c, through
// shared memory: kReadAlongRows = false reads along c (piece → transposed iterate), true
// reads along r (transposed result → piece).
template <bool kTranspose, bool kReadAlongRows, typename Read, typename Write>
__device__ void move_tile(int64_t R, int64_t C, Read&& read, Write&& write) {
  __shared__ float tile[kTile][kTile + 1];  // [first phase's i][threadIdx.x] (padded against bank conflicts)
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  if constexpr (!kTranspose) {
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < R && c < C) write(r, c, read(r, c));
    }
  } else {
    // Thread (x, i) of a phase is element (r0 + i, c0 + x) along c, (r0 + x, c0 + i) along r.
    auto row = [&](bool along_rows, int i) { return along_rows ? r0 + threadIdx.x : r0 + i; };
    auto col = [&](bool along_rows, int i) { return along_rows ? c0 + i : c0 + threadIdx.x; };
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = row(kReadAlongRows, i), c = col(kReadAlongRows, i);
      tile[i][threadIdx.x] = (r < R && c < C) ? read(r, c) : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = row(!kReadAlongRows, i), c = col(!kReadAlongRows, i);
      if (r < R && c < C) write(r, c, tile[threadIdx.x][i]);
    }
  }
}

// Element (r, c) of item rows in the iterate: row-major m×ld, transposed for tall items.
template <bool kTranspose>
__device__ __forceinline__ int64_t iterate_at(int64_t r, int64_t c, int64_t ld) {
  return kTranspose ? c * ld + r : r * ld + c;
}

// ---------------------------------------------------------------- kernels
template <typename P>
__global__ void check_kernel(const __grid_constant__ DescList<CheckDesc> list, int* __restrict__ flags,
                             float* __restrict__ partials) {
  const CheckDesc& d = list.d[blockIdx.y];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kPartialChunk;
  if (begin >= d.numel && blockIdx.x > 0) return;  // NOTE: uniform over the block
  const int64_t end = min(d.numel, begin + kPartialChunk);
  const P* grad = static_cast<const P*>(d.grad);
  const P* momentum = static_cast<const P*>(d.momentum);
  float acc = 0.f;
  bool grad_ok = true, momentum_ok = true;
  for (int64_t e = begin + threadIdx.x; e < end; e += kThreads) {
    const int64_t i = strided_at(e, d.row_len, d.ld);
    grad_ok = grad_ok && finite_at(grad, i);
    momentum_ok = momentum_ok && finite_at(momentum, i);
    // NOTE: float64 is only ever checked (gradients checked with the step), never summed.
    if constexpr (!std::is_same_v<P, double>) {
      const float g = load(grad, i), m = load(momentum, i);
      const float m_new = round_to<P>(lerp(m, g, d.rule.buffer_weight));
      const float u = d.rule.nesterov ? round_to<P>(lerp(g, m_new, d.rule.nesterov_weight)) : m_new;
      acc = fmaf(u, u, acc);
    }
  }
  if (d.partial_offset >= 0) {
    const float total = block_sum(acc);
    if (threadIdx.x == 0) partials[d.partial_offset + blockIdx.x] = total;
  }
  if (!grad_ok) atomicOr(flags + 2 * d.flag_idx, 1);
  if (!momentum_ok) atomicOr(flags + 2 * d.flag_idx + 1, 1);
}

// One atomic per warp: an integer sum is the same in any order.
template <typename Bits>
__global__ void fingerprint_kernel(const __grid_constant__ DescList<FingerprintDesc> list,
                                   unsigned long long* __restrict__ sum) {
  const FingerprintDesc& d = list.d[blockIdx.y];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kPartialChunk;
  const int64_t end = min(d.numel, begin + kPartialChunk);
  const Bits* bits = static_cast<const Bits*>(d.data);
  unsigned long long acc = 0;
  for (int64_t e = begin + threadIdx.x; e < end; e += kThreads)
    acc += fingerprint_term(bits[strided_at(e, d.row_len, d.ld)], d.key, e);
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (threadIdx.x % 32 == 0 && acc != 0) atomicAdd(sum, acc);
}

template <typename P, typename W>
__global__ void prepare_kernel(const __grid_constant__ DescList<PrepareDesc> list, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;
  const PrepareDesc& d = list.d[blockIdx.y];
  const P* grad = static_cast<const P*>(d.grad);
  P* momentum = static_cast<P*>(d.momentum);
  W* wire = static_cast<W*>(d.wire);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < d.numel;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float u = momentum_update(grad, momentum, strided_at(i, d.row_len, d.ld), d.rule, true);
    if (wire != nullptr) wire[i] = from_f<W>(u);
  }
}

template <typename W>
__global__ void sum_squares_kernel(const __grid_constant__ DescList<WireDesc> list, float* __restrict__ partials) {
  const WireDesc& d = list.d[blockIdx.y];
  const int64_t numel = d.row_count * d.col_count;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kPartialChunk;
  if (begin >= numel && blockIdx.x > 0) return;  // NOTE: uniform over the block
  const int64_t end = min(numel, begin + kPartialChunk);
  const W* wire = static_cast<const W*>(d.wire);
  float acc = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float v = load(wire, i);
    acc = fmaf(v, v, acc);
  }
  const float total = block_sum(acc);
  if (threadIdx.x == 0) partials[d.partial_offset + blockIdx.x] = total;
}

struct ScaleList {
  int64_t offset[kMaxPiecesPerLaunch];
  int64_t count[kMaxPiecesPerLaunch];
};

__global__ void scales_kernel(const float* __restrict__ partials, const __grid_constant__ ScaleList list, float eps,
                              float* __restrict__ out) {
  const int k = blockIdx.x;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < list.count[k]; i += kThreads) acc += partials[list.offset[k] + i];
  const float total = block_sum(acc);
  if (threadIdx.x == 0) out[k] = 1.f / fmaxf(sqrtf(total), eps);
}

template <typename P, typename T, bool kTranspose>
__global__ void local_to_iterate_kernel(const __grid_constant__ DescList<LocalDesc> list, int64_t rows, int64_t cols,
                                        bool update_momentum, const float* __restrict__ scales, T* __restrict__ iterate,
                                        int64_t ld, int64_t stride, const int* __restrict__ skip) {
  const LocalDesc& d = list.d[blockIdx.z];
  const bool skipped = is_skipped(skip);
  const float scale = skipped ? 0.f : scales[d.matrix_idx];
  const P* grad = static_cast<const P*>(d.grad);
  P* momentum = static_cast<P*>(d.momentum);
  T* dst = iterate + d.matrix_idx * stride;
  const int64_t row_stride = d.ld > 0 ? d.ld : cols;
  move_tile<kTranspose, false>(
      rows, cols,
      [&](int64_t r, int64_t c) {
        return skipped ? 0.f : momentum_update(grad, momentum, r * row_stride + c, d.rule, update_momentum);
      },
      [&](int64_t r, int64_t c, float u) { dst[iterate_at<kTranspose>(r, c, ld)] = from_f<T>(u * scale); });
}

template <typename W, typename T, bool kTranspose>
__global__ void pieces_to_iterate_kernel(const __grid_constant__ DescList<WireDesc> list, int64_t cols,
                                         const float* __restrict__ scales, T* __restrict__ iterate, int64_t ld,
                                         int64_t stride, const int* __restrict__ skip) {
  const WireDesc& d = list.d[blockIdx.z];
  const float scale = is_skipped(skip) ? 0.f : scales[d.matrix_idx];
  const W* wire = static_cast<const W*>(d.wire);
  T* dst = iterate + d.matrix_idx * stride;
  // Block element (r, c): wire [r, c] of [row_count, col_count]; item (row_begin + r, col_begin + c).
  move_tile<kTranspose, false>(
      d.row_count, d.col_count, [&](int64_t r, int64_t c) { return load(wire, r * d.col_count + c); },
      [&](int64_t r, int64_t c, float v) {
        dst[iterate_at<kTranspose>(d.row_begin + r, d.col_begin + c, ld)] = from_f<T>(v * scale);
      });
}

// The row factors of one matrix of a result (IterateView::row_scale), or none.
struct RowFactors {
  const float* f = nullptr;  ///< [rows] of this matrix, null: none
  __device__ __forceinline__ float of(int64_t row) const { return f != nullptr ? f[row] : 1.f; }
};
__device__ __forceinline__ RowFactors row_factors(const float* scale, const int* scaled, int64_t rows,
                                                  int64_t matrix) {
  return {scale != nullptr && scaled[matrix] != 0 ? scale + matrix * rows : nullptr};
}

template <typename T, typename W, bool kTranspose>
__global__ void result_to_pieces_kernel(const T* __restrict__ result, int64_t ld, int64_t stride,
                                        const __grid_constant__ DescList<WireDesc> list, int64_t rows,
                                        const float* __restrict__ scale, const int* __restrict__ scaled) {
  const WireDesc& d = list.d[blockIdx.z];
  const T* src = result + d.matrix_idx * stride;
  const RowFactors factors = row_factors(scale, scaled, rows, d.matrix_idx);
  W* wire = static_cast<W*>(d.wire);
  move_tile<kTranspose, true>(
      d.row_count, d.col_count,
      [&](int64_t r, int64_t c) {
        return load(src, iterate_at<kTranspose>(d.row_begin + r, d.col_begin + c, ld)) * factors.of(d.row_begin + r);
      },
      [&](int64_t r, int64_t c, float v) { wire[r * d.col_count + c] = from_f<W>(v); });
}

// round(round(p·decay) + scale·O); a non-finite O is not applied (only the decay is).
template <typename P>
__device__ __forceinline__ P applied(float p, float o, float scale, float decay, bool& bad) {
  if (decay != 1.f) p = round_to<P>(p * decay);
  if (!isfinite(o)) {
    bad = true;
    o = 0.f;
  }
  return from_f<P>(p + scale * o);
}
template <typename P>
__device__ __forceinline__ void apply_at(P* param, int64_t i, float o, float scale, float decay, bool& bad) {
  param[i] = applied<P>(load(param, i), o, scale, decay, bad);
}

template <typename T, typename P, bool kTranspose>
__global__ void apply_result_kernel(const T* __restrict__ result, int64_t ld, int64_t stride,
                                    const __grid_constant__ DescList<ApplyDesc> list, int64_t rows,
                                    const float* __restrict__ scale, const int* __restrict__ scaled, int round,
                                    int* __restrict__ flags, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;  // NOTE: the whole block returns, before any barrier
  const ApplyDesc& d = list.d[blockIdx.z];
  const T* src = result + d.matrix_idx * stride;
  const RowFactors factors = row_factors(scale, scaled, rows, d.matrix_idx);
  P* param = static_cast<P*>(d.param);
  const int64_t row_stride = d.param_row_stride();
  bool bad = false;
  move_tile<kTranspose, true>(
      d.row_count, d.col_count,
      [&](int64_t r, int64_t c) {
        return load(src, iterate_at<kTranspose>(d.row_begin + r, d.col_begin + c, ld)) * factors.of(d.row_begin + r);
      },
      [&](int64_t r, int64_t c, float o) {
        apply_at(param, r * row_stride + c, round_to<P>(round_code(o, round)), d.scale, d.decay, bad);
      });
  if (bad) atomicOr(flags + d.flag_idx, 1);
}

// N consecutive elements moved as one access (N·sizeof(T) bytes, aligned to it).
template <typename T, int N>
struct alignas(N * sizeof(T)) Run {
  T e[N];
};

// Four parameters of a run ← applied(p, o(e)·factor rounded as apply_result_kernel rounds O).
template <typename P, typename O>
__device__ __forceinline__ void apply_run(P* at, O&& o, float factor, int round, const ApplyDesc& d, bool& bad) {
  Run<P, 4>* run = reinterpret_cast<Run<P, 4>*>(at);
  Run<P, 4> p = *run;
  for (int e = 0; e < 4; ++e)
    p.e[e] = applied<P>(load(p.e, e), round_to<P>(round_code(o(e) * factor, round)), d.scale, d.decay, bad);
  *run = p;
}

// apply_result_kernel's arithmetic, element for element, with vector accesses: pieces
// whose parameter rows are whole aligned runs of 4 and whose result rows (runs of 4, or 8
// of the transposed result) start aligned (apply_result_vectorizes checks it per launch).
// NOTE: on an H100 (copy rate 2.97 TB/s) the scalar tiles moved Qwen2.5-7B's matrices at
// 1.65 TB/s transposed and 2.2 row-major; these move 2.9 (torch.profiler, `bench ns`), and
// the one-GPU step lost 1.9-2.4% to the scalar tiles against the pre-engine fused path.
// Rows: a block is 32 rows × 128 columns; thread (x, y) the columns 4x… of rows y + 8k.
constexpr int kVecRows = 32, kVecCols = 128;
template <typename T, typename P>
__global__ void apply_result_rows_kernel(const T* __restrict__ result, int64_t ld, int64_t stride,
                                         const __grid_constant__ DescList<ApplyDesc> list, int64_t rows,
                                         const float* __restrict__ scale, const int* __restrict__ scaled, int round,
                                         int* __restrict__ flags, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;
  const ApplyDesc& d = list.d[blockIdx.z];
  const T* src = result + d.matrix_idx * stride;
  const RowFactors factors = row_factors(scale, scaled, rows, d.matrix_idx);
  P* param = static_cast<P*>(d.param);
  const int64_t row_stride = d.param_row_stride();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kVecCols + 4 * threadIdx.x;
  bool bad = false;
  if (c < d.col_count) {
    for (int k = threadIdx.y; k < kVecRows; k += kTileRows) {
      const int64_t r = static_cast<int64_t>(blockIdx.y) * kVecRows + k;
      if (r >= d.row_count) break;
      const Run<T, 4> o = *reinterpret_cast<const Run<T, 4>*>(src + (d.row_begin + r) * ld + d.col_begin + c);
      apply_run(param + r * row_stride + c, [&](int e) { return load(o.e, e); }, factors.of(d.row_begin + r), round,
                d, bad);
    }
  }
  if (bad) atomicOr(flags + d.flag_idx, 1);
}

// Transposed: a block is 64 × 64 through shared memory; the result's rows (the parameter's
// columns) read in runs of 8, the parameter's rows written in runs of 4.
constexpr int kVecTile = 64;
template <typename T, typename P>
__global__ void apply_result_columns_kernel(const T* __restrict__ result, int64_t ld, int64_t stride,
                                            const __grid_constant__ DescList<ApplyDesc> list, int64_t rows,
                                            const float* __restrict__ scale, const int* __restrict__ scaled, int round,
                                            int* __restrict__ flags, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;  // NOTE: the whole block returns, before any barrier
  __shared__ float tile[kVecTile][kVecTile + 1];  // [parameter column − c0][parameter row − r0]
  const ApplyDesc& d = list.d[blockIdx.z];
  const T* src = result + d.matrix_idx * stride;
  const RowFactors factors = row_factors(scale, scaled, rows, d.matrix_idx);
  P* param = static_cast<P*>(d.param);
  const int64_t row_stride = d.param_row_stride();
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVecTile, c0 = static_cast<int64_t>(blockIdx.x) * kVecTile;
  if (r0 >= d.row_count || c0 >= d.col_count) return;  // NOTE: uniform over the block
  const int t = threadIdx.y * kTile + threadIdx.x;
  // NOTE: a run may reach past the piece's rows, never past ld (ld % 8 == 0): read, not used.
  for (int i = t / 8; i < kVecTile; i += kThreads / 8) {
    const int q = t % 8;
    const int64_t o_row = d.col_begin + c0 + i, o_col = d.row_begin + r0 + 8 * q;
    Run<T, 8> o{};
    if (c0 + i < d.col_count && o_col < ld) o = *reinterpret_cast<const Run<T, 8>*>(src + o_row * ld + o_col);
    for (int e = 0; e < 8; ++e) tile[i][8 * q + e] = load(o.e, e);
  }
  __syncthreads();
  bool bad = false;
  for (int i = t / 16; i < kVecTile; i += kThreads / 16) {
    const int j = t % 16;
    const int64_t r = r0 + i, c = c0 + 4 * j;
    if (r >= d.row_count || c >= d.col_count) continue;  // NOTE: col_count % 4 == 0: the run is whole
    apply_run(param + r * row_stride + c, [&](int e) { return tile[4 * j + e][i]; }, factors.of(d.row_begin + r),
              round, d, bad);
  }
  if (bad) atomicOr(flags + d.flag_idx, 1);
}

template <typename W, typename P>
__global__ void apply_wire_kernel(const __grid_constant__ DescList<ApplyDesc> list, int64_t cols,
                                  int* __restrict__ flags, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;
  const ApplyDesc& d = list.d[blockIdx.y];
  const W* wire = static_cast<const W*>(d.wire);
  P* param = static_cast<P*>(d.param);
  const int64_t numel = d.row_count * cols;
  bool bad = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    apply_at(param, strided_at(i, d.row_len, d.ld), round_to<P>(load(wire, i)), d.scale, d.decay, bad);
  if (bad) atomicOr(flags + d.flag_idx, 1);
}

template <typename T>
__global__ void synthetic_kernel(T* __restrict__ data, int64_t numel, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    data[i] = from_f<T>(synthetic_value(seed, static_cast<uint64_t>(i)));
}

// Element loads and stores in the sum's arithmetic type A (float, or double for float64).
template <typename A, typename T>
__device__ __forceinline__ A wide(T v) {
  if constexpr (std::is_same_v<T, __half>) return static_cast<A>(__half2float(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return static_cast<A>(__bfloat162float(v));
  else return static_cast<A>(v);
}
template <typename T, typename A>
__device__ __forceinline__ T narrow(A v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <typename S, typename D, typename A>
__global__ void sum_into_kernel(const S* __restrict__ src, int64_t num_parts, int64_t part_stride, D* __restrict__ dst,
                                int64_t numel,
                                A scale, int accumulate) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    A sum = 0;
    for (int64_t k = 0; k < num_parts; ++k) sum += wide<A>(src[k * part_stride + i]);
    const A base = accumulate ? wide<A>(dst[i]) : A(0);
    dst[i] = narrow<D>(base + scale * sum);
  }
}

template <typename U>
__global__ void copy_kernel(const __grid_constant__ DescList<CopyDesc> list) {
  const CopyDesc& d = list.d[blockIdx.y];
  const U* src = static_cast<const U*>(d.src);
  U* dst = static_cast<U*>(d.dst);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < d.numel;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    dst[strided_at(i, d.dst_row_len, d.dst_ld)] = src[strided_at(i, d.src_row_len, d.src_ld)];
}

__global__ void any_nonzero_kernel(const int* __restrict__ flags, int64_t n, int* __restrict__ gate) {
  int any = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) any |= flags[i] != 0 ? 1 : 0;
  any = __syncthreads_or(any);
  if (threadIdx.x == 0) *gate = any;
}

}  // namespace

// ---------------------------------------------------------------- host side
int64_t num_chunks(int64_t numel) { return std::max<int64_t>(1, (numel + kPartialChunk - 1) / kPartialChunk); }

Rule make_rule(double momentum, bool nesterov) {
  return {static_cast<float>(1.0 - momentum), static_cast<float>(momentum), nesterov ? 1 : 0};
}

void check(DType param, const std::vector<CheckDesc>& pieces, int* flags, float* partials, cudaStream_t stream) {
  auto launch = [&](auto zero) {
    using P = decltype(zero);
    for_each_launch(pieces, [&](const DescList<CheckDesc>& list, size_t) {
      int64_t chunks = 1;
      for (int k = 0; k < list.n; ++k) chunks = std::max(chunks, num_chunks(list.d[k].numel));
      check_kernel<P><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(list.n)), kThreads, 0, stream>>>(
          list, flags, partials);
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  };
  if (param == DType::kFloat64) {
    for (const CheckDesc& d : pieces)
      DMUON_CHECK(d.partial_offset < 0, "check: float64 pieces are only checked, never summed");
    launch(double{});
  } else {
    dispatch(param, launch);
  }
}

void fingerprint(int width, const std::vector<FingerprintDesc>& pieces, unsigned long long* sum, cudaStream_t stream) {
  with_element_bits(width, [&](auto zero) {
    using Bits = decltype(zero);
    for_each_launch(pieces, [&](const DescList<FingerprintDesc>& list, size_t) {
      int64_t chunks = 1;
      for (int k = 0; k < list.n; ++k) chunks = std::max(chunks, num_chunks(list.d[k].numel));
      fingerprint_kernel<Bits><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(list.n)), kThreads, 0,
                                 stream>>>(list, sum);
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  });
}

void prepare(DType param, DType wire, const std::vector<PrepareDesc>& pieces, const int* skip, cudaStream_t stream) {
  dispatch(param, [&](auto pz) {
    using P = decltype(pz);
    dispatch(wire, [&](auto wz) {
      using W = decltype(wz);
      for_each_launch(pieces, [&](const DescList<PrepareDesc>& list, size_t) {
        int64_t numel = 1;
        for (int k = 0; k < list.n; ++k) numel = std::max(numel, list.d[k].numel);
        prepare_kernel<P, W><<<dim3(flat_blocks(numel), static_cast<unsigned>(list.n)), kThreads, 0, stream>>>(list,
                                                                                                              skip);
        DMUON_CHECK_CUDA(cudaGetLastError());
      });
    });
  });
}

void sum_squares(DType wire, const std::vector<WireDesc>& pieces, float* partials, cudaStream_t stream) {
  dispatch(wire, [&](auto wz) {
    using W = decltype(wz);
    for_each_launch(pieces, [&](const DescList<WireDesc>& list, size_t) {
      int64_t chunks = 1;
      for (int k = 0; k < list.n; ++k) chunks = std::max(chunks, num_chunks(list.d[k].row_count * list.d[k].col_count));
      sum_squares_kernel<W><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(list.n)), kThreads, 0,
                              stream>>>(list, partials);
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  });
}

void scales(const float* partials, const std::vector<int64_t>& offset, const std::vector<int64_t>& count, double eps,
            float* scales_out, cudaStream_t stream) {
  DMUON_CHECK(offset.size() == count.size(), "scales: ", offset.size(), " offsets for ", count.size(), " counts");
  for (size_t first = 0; first < offset.size(); first += kMaxPiecesPerLaunch) {
    const size_t n = std::min<size_t>(kMaxPiecesPerLaunch, offset.size() - first);
    ScaleList list{};
    for (size_t k = 0; k < n; ++k) list.offset[k] = offset[first + k], list.count[k] = count[first + k];
    scales_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(partials, list, static_cast<float>(eps),
                                                                     scales_out + first);
    DMUON_CHECK_CUDA(cudaGetLastError());
  }
}

void zero_padding(const IterateView& it, int64_t count, cudaStream_t stream) {
  const int64_t n = std::max(it.rows, it.cols), m = std::min(it.rows, it.cols);
  if (it.ld == n || count == 0) return;
  DMUON_CHECK(it.stride == m * it.ld, "zero_padding: matrices must be packed (stride ", it.stride, ", m·ld ",
              m * it.ld, ")");
  const size_t elem = static_cast<size_t>(dtype_size(it.dtype));
  DMUON_CHECK_CUDA(cudaMemset2DAsync(static_cast<char*>(it.data) + n * elem, it.ld * elem, 0, (it.ld - n) * elem,
                                     static_cast<size_t>(count * m), stream));
}

void local_to_iterate(DType param, const std::vector<LocalDesc>& matrices, bool update_momentum, const float* scales_in,
                      const IterateView& it, const int* skip, cudaStream_t stream) {
  dispatch(param, [&](auto pz) {
    using P = decltype(pz);
    dispatch_half(it.dtype, [&](auto tz) {
      using T = decltype(tz);
      for_each_launch(matrices, [&](const DescList<LocalDesc>& list, size_t) {
        const dim3 grid = tile_grid(it.rows, it.cols, list.n), block(kTile, kTileRows);
        T* out = static_cast<T*>(it.data);
        if (it.transposed())
          local_to_iterate_kernel<P, T, true><<<grid, block, 0, stream>>>(list, it.rows, it.cols, update_momentum,
                                                                         scales_in, out, it.ld, it.stride, skip);
        else
          local_to_iterate_kernel<P, T, false><<<grid, block, 0, stream>>>(list, it.rows, it.cols, update_momentum,
                                                                          scales_in, out, it.ld, it.stride, skip);
        DMUON_CHECK_CUDA(cudaGetLastError());
      });
    });
  });
}

void pieces_to_iterate(DType wire, const std::vector<WireDesc>& pieces, const float* scales_in, const IterateView& it,
                       const int* skip, cudaStream_t stream) {
  dispatch(wire, [&](auto wz) {
    using W = decltype(wz);
    dispatch_half(it.dtype, [&](auto tz) {
      using T = decltype(tz);
      for_each_launch(pieces, [&](const DescList<WireDesc>& list, size_t) {
        int64_t rows = 1, cols = 1;
        for (int k = 0; k < list.n; ++k) rows = std::max(rows, list.d[k].row_count), cols = std::max(cols, list.d[k].col_count);
        const dim3 grid = tile_grid(rows, cols, list.n), block(kTile, kTileRows);
        T* out = static_cast<T*>(it.data);
        if (it.transposed())
          pieces_to_iterate_kernel<W, T, true><<<grid, block, 0, stream>>>(list, it.cols, scales_in, out, it.ld,
                                                                          it.stride, skip);
        else
          pieces_to_iterate_kernel<W, T, false><<<grid, block, 0, stream>>>(list, it.cols, scales_in, out, it.ld,
                                                                           it.stride, skip);
        DMUON_CHECK_CUDA(cudaGetLastError());
      });
    });
  });
}

void result_to_pieces(DType wire, const IterateView& result, const std::vector<WireDesc>& pieces, cudaStream_t stream) {
  dispatch_half(result.dtype, [&](auto tz) {
    using T = decltype(tz);
    dispatch(wire, [&](auto wz) {
      using W = decltype(wz);
      for_each_launch(pieces, [&](const DescList<WireDesc>& list, size_t) {
        int64_t rows = 1, cols = 1;
        for (int k = 0; k < list.n; ++k) rows = std::max(rows, list.d[k].row_count), cols = std::max(cols, list.d[k].col_count);
        const dim3 grid = tile_grid(rows, cols, list.n), block(kTile, kTileRows);
        const T* src = static_cast<const T*>(result.data);
        if (result.transposed())
          result_to_pieces_kernel<T, W, true><<<grid, block, 0, stream>>>(
              src, result.ld, result.stride, list, result.rows, result.row_scale, result.row_scaled);
        else
          result_to_pieces_kernel<T, W, false><<<grid, block, 0, stream>>>(
              src, result.ld, result.stride, list, result.rows, result.row_scale, result.row_scaled);
        DMUON_CHECK_CUDA(cudaGetLastError());
      });
    });
  });
}

bool apply_result_vectorizes(const IterateView& result, const ApplyDesc* pieces, int count, DType param) {
  const auto param_bytes = static_cast<size_t>(dtype_size(param));
  const auto result_bytes = static_cast<size_t>(dtype_size(result.dtype));
  if (!ns::cuda::aligned_to(result.data, 8 * result_bytes) || result.ld % 8 != 0 || result.stride % 8 != 0) return false;
  for (int k = 0; k < count; ++k) {
    const ApplyDesc& d = pieces[k];
    if (!ns::cuda::aligned_to(d.param, 4 * param_bytes) || d.param_row_stride() % 4 != 0 || d.col_count % 4 != 0)
      return false;
    if (result.transposed() ? d.row_begin % 8 != 0 : d.col_begin % 4 != 0) return false;
  }
  return true;
}

void apply_result(DType param, DType round_wire, const IterateView& result, const std::vector<ApplyDesc>& pieces,
                  int* flags, const int* skip, cudaStream_t stream) {
  const int round = round_wire == DType::kBFloat16 ? kRoundBF16 : round_wire == DType::kFloat16 ? kRoundF16 : kRoundNone;
  dispatch_half(result.dtype, [&](auto tz) {
    using T = decltype(tz);
    dispatch(param, [&](auto pz) {
      using P = decltype(pz);
      for_each_launch(pieces, [&](const DescList<ApplyDesc>& list, size_t) {
        int64_t rows = 1, cols = 1;
        for (int k = 0; k < list.n; ++k) rows = std::max(rows, list.d[k].row_count), cols = std::max(cols, list.d[k].col_count);
        const dim3 block(kTile, kTileRows);
        const T* src = static_cast<const T*>(result.data);
        if (apply_result_vectorizes(result, list.d, list.n, param)) {
          const dim3 grid = result.transposed() ? tile_grid(rows, cols, list.n, kVecTile, kVecTile)
                                                : tile_grid(rows, cols, list.n, kVecRows, kVecCols);
          auto kernel = result.transposed() ? apply_result_columns_kernel<T, P> : apply_result_rows_kernel<T, P>;
          kernel<<<grid, block, 0, stream>>>(src, result.ld, result.stride, list, result.rows, result.row_scale,
                                             result.row_scaled, round, flags, skip);
          DMUON_CHECK_CUDA(cudaGetLastError());
          return;
        }
        const dim3 grid = tile_grid(rows, cols, list.n);
        if (result.transposed())
          apply_result_kernel<T, P, true><<<grid, block, 0, stream>>>(
              src, result.ld, result.stride, list, result.rows, result.row_scale, result.row_scaled, round, flags, skip);
        else
          apply_result_kernel<T, P, false><<<grid, block, 0, stream>>>(
              src, result.ld, result.stride, list, result.rows, result.row_scale, result.row_scaled, round, flags,
              skip);
        DMUON_CHECK_CUDA(cudaGetLastError());
      });
    });
  });
}

void apply_wire(DType param, DType wire, const std::vector<ApplyDesc>& pieces, int64_t cols, int* flags,
                const int* skip, cudaStream_t stream) {
  dispatch(param, [&](auto pz) {
    using P = decltype(pz);
    dispatch(wire, [&](auto wz) {
      using W = decltype(wz);
      for_each_launch(pieces, [&](const DescList<ApplyDesc>& list, size_t) {
        int64_t numel = 1;
        for (int k = 0; k < list.n; ++k) numel = std::max(numel, list.d[k].row_count * cols);
        apply_wire_kernel<W, P><<<dim3(flat_blocks(numel), static_cast<unsigned>(list.n)), kThreads, 0, stream>>>(
            list, cols, flags, skip);
        DMUON_CHECK_CUDA(cudaGetLastError());
      });
    });
  });
}

void fill_synthetic(DType dtype, void* data, int64_t numel, uint64_t seed, cudaStream_t stream) {
  if (numel == 0) return;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    synthetic_kernel<T><<<flat_blocks(numel), kThreads, 0, stream>>>(static_cast<T*>(data), numel, seed);
    DMUON_CHECK_CUDA(cudaGetLastError());
  });
}

void sum_into(DType src_dtype, const void* src, int64_t num_parts, int64_t part_stride, DType dst_dtype, void* dst,
              int64_t numel,
              double scale, bool accumulate, cudaStream_t stream) {
  if (numel == 0) return;
  // NOTE: float64 on either side sums in double (the engine's float64 parameters).
  auto any = [](DType dtype, auto&& fn) {
    if (dtype == DType::kFloat64) return fn(double{});
    dispatch(dtype, fn);
  };
  any(src_dtype, [&](auto s_zero) {
    using S = decltype(s_zero);
    any(dst_dtype, [&](auto d_zero) {
      using D = decltype(d_zero);
      using A = std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double, float>;
      sum_into_kernel<S, D, A><<<flat_blocks(numel), kThreads, 0, stream>>>(
          static_cast<const S*>(src), num_parts, part_stride, static_cast<D*>(dst), numel, static_cast<A>(scale), accumulate ? 1 : 0);
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  });
}

void copy(int unit_bytes, const std::vector<CopyDesc>& pieces, cudaStream_t stream) {
  auto launch = [&](auto zero) {
    using U = decltype(zero);
    for_each_launch(pieces, [&](const DescList<CopyDesc>& list, size_t) {
      int64_t numel = 1;
      for (int k = 0; k < list.n; ++k) numel = std::max(numel, list.d[k].numel);
      copy_kernel<U><<<dim3(flat_blocks(numel), static_cast<unsigned>(list.n)), kThreads, 0, stream>>>(list);
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  };
  switch (unit_bytes) {
    case 1: return launch(uint8_t{});
    case 2: return launch(uint16_t{});
    case 4: return launch(uint32_t{});
    case 8: return launch(uint2{});
    case 16: return launch(uint4{});
    default: DMUON_FAIL("copy: units of ", unit_bytes, " bytes (1, 2, 4, 8 or 16)");
  }
}

void any_nonzero(const int* flags, int64_t n, int* gate, cudaStream_t stream) {
  any_nonzero_kernel<<<1, kThreads, 0, stream>>>(flags, n, gate);
  DMUON_CHECK_CUDA(cudaGetLastError());
}

}  // namespace dmuon::step::cuda
