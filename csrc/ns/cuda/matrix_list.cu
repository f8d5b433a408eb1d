// dmuon/ns/cuda/matrix_list.cu — fused momentum and normalization over matrix lists.
#include "ns/cuda/matrix_list.h"

#include <algorithm>

#include "ns/cuda/alignment.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/half_types.cuh"

namespace dmuon::ns::cuda {
namespace {

// Matrices per launch: their pointers travel in the kernel's parameters.
// NOTE: 64 × 2 pointers = 1 KiB, inside the classic 4 KiB parameter limit.
constexpr int kMaxPerLaunch = 64;
constexpr int kThreads = 256;
// Tile of the transposing kernels: 64×64 elements, 32×8 threads (each thread 2 columns,
// tx and tx + 32, of 8 rows).
// NOTE: on the H200 32×32 tiles (4 elements a thread) moved the transposed
// Qwen2.5-0.5B gate/up matrices at 2.2 TB/s, half of what the untransposed kernels reach.
constexpr int kTile = 64;
constexpr int kTileRows = 8;
constexpr int kHalfTile = 32;
static_assert(kHalfTile * kTileRows == kThreads, "the tile kernels index their 32×8 threads as 0..kThreads−1");

struct Pointers {
  const float* grad[kMaxPerLaunch];
  float* momentum[kMaxPerLaunch];
};


// Four 16-bit values as one 8-byte word (x in the low half of .x) and back.
template <typename T>
__device__ __forceinline__ uint2 pack4(float a, float b, float c, float d) {
  auto bits = [](float v) {
    const T h = from_float<T>(v);
    return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&h));
  };
  return make_uint2(bits(a) | (bits(b) << 16), bits(c) | (bits(d) << 16));
}
// ATen's lerp (aten/src/ATen/native/Lerp.h), so the momentum matches torch's _foreach_lerp_.
__device__ __forceinline__ float lerp(float self, float end, float weight) {
  const float diff = end - self;
  return fabsf(weight) < 0.5f ? self + weight * diff : end - diff * (1.f - weight);
}

// The momentum rule in float, as the multi-tensor ops see their scalar weights.
struct Rule {
  float buffer_weight;    // 1 − μ: momentum ← lerp(momentum, grad, 1 − μ)
  float nesterov_weight;  // μ: U ← lerp(grad, momentum, μ)
  bool nesterov;
};

Rule make_rule(MomentumRule rule) {
  return {static_cast<float>(1.0 - rule.momentum), static_cast<float>(rule.momentum), rule.nesterov};
}

__device__ __forceinline__ float update_of(float grad, float momentum, const Rule& rule) {
  return rule.nesterov ? lerp(grad, momentum, rule.nesterov_weight) : momentum;
}

// Four elements at `at` of grad and momentum (16-byte aligned): the update, after writing
// the new momentum when kUpdateMomentum.
template <bool kUpdateMomentum>
__device__ __forceinline__ float4 update4_at(const float* grad, float* momentum, int64_t at, const Rule& rule) {
  const float4 g = *reinterpret_cast<const float4*>(grad + at);
  float4 m = *reinterpret_cast<const float4*>(momentum + at);
  if constexpr (kUpdateMomentum) {
    m.x = lerp(m.x, g.x, rule.buffer_weight);
    m.y = lerp(m.y, g.y, rule.buffer_weight);
    m.z = lerp(m.z, g.z, rule.buffer_weight);
    m.w = lerp(m.w, g.w, rule.buffer_weight);
    *reinterpret_cast<float4*>(momentum + at) = m;
  }
  return make_float4(update_of(g.x, m.x, rule), update_of(g.y, m.y, rule), update_of(g.z, m.z, rule),
                     update_of(g.w, m.w, rule));
}

// The step's gate (step/device_ops.h: DeviceOps::make_gate): a non-zero *skip (device memory, written by earlier
// kernels of the stream) turns the pass into a no-op: no momentum is written and
// the iterate gets zeros. Null: never skipped.
__device__ __forceinline__ bool is_skipped(const int* skip) { return skip != nullptr && *skip != 0; }

// Wide iterate, rows ≤ cols (no transpose), 4 elements per thread: out[r][c..c+3].
// NOTE: cols % 4 == 0 and aligned pointers (host-checked); the thread that writes a row's
// last 4 elements also zeroes its padding columns [cols, ld).
template <typename T, bool kUpdateMomentum>
__global__ void normalized_update_flat_kernel(const __grid_constant__ Pointers ptrs, int64_t rows,
                                              int64_t cols, Rule rule,
                                              const float* __restrict__ scales,  // [count]
                                              T* __restrict__ out, int64_t ld,   // [count, rows, ld]
                                              const int* __restrict__ skip) {
  const int b = blockIdx.y;
  const float* grad = ptrs.grad[b];
  float* momentum = ptrs.momentum[b];
  const bool skipped = is_skipped(skip);
  const float scale = skipped ? 0.f : scales[b];
  T* dst = out + static_cast<int64_t>(b) * rows * ld;
  const int64_t numel = rows * cols;
  for (int64_t i = 4 * (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x); i < numel;
       i += 4 * static_cast<int64_t>(gridDim.x) * kThreads) {
    const float4 u = skipped ? make_float4(0.f, 0.f, 0.f, 0.f) : update4_at<kUpdateMomentum>(grad, momentum, i, rule);
    const int64_t r = i / cols, c = i - r * cols;
    // NOTE: ld % 8 == 0 and c % 4 == 0: one aligned 8-byte store.
    *reinterpret_cast<uint2*>(dst + r * ld + c) = pack4<T>(u.x * scale, u.y * scale, u.z * scale, u.w * scale);
    if (c + 4 == cols)
      for (int64_t p = cols; p < ld; ++p) dst[r * ld + p] = from_float<T>(0.f);
  }
}

// Any shape: 64×64 tiles of the iterate (m×ld); kTranspose → out[r][c] = U[c][r].
template <typename T, bool kTranspose, bool kUpdateMomentum>
__global__ void normalized_update_tile_kernel(const __grid_constant__ Pointers ptrs, int64_t rows,
                                              int64_t cols, Rule rule,
                                              const float* __restrict__ scales,  // [count]
                                              T* __restrict__ out, int64_t ld,   // [count, m, ld]
                                              const int* __restrict__ skip) {
  __shared__ float tile[kTile][kTile + 1];  // [64, 65] (padded against bank conflicts)
  const int b = blockIdx.z;
  const float* grad = ptrs.grad[b];
  float* momentum = ptrs.momentum[b];
  const bool skipped = is_skipped(skip);
  // The update at one element, writing the new momentum first when kUpdateMomentum.
  auto update_at = [&](int64_t at) {
    if (skipped) return 0.f;
    const float g = grad[at];
    float m = momentum[at];
    if constexpr (kUpdateMomentum) {
      m = lerp(m, g, rule.buffer_weight);
      momentum[at] = m;
    }
    return update_of(g, m, rule);
  };
  const float scale = skipped ? 0.f : scales[b];
  const int64_t m = kTranspose ? cols : rows, n = kTranspose ? rows : cols;
  T* dst = out + static_cast<int64_t>(b) * m * ld;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  if constexpr (kTranspose) {
    // Read U[c0+i][r0+j] (coalesced along the source's rows), write out[r0+i][c0+j].
    for (int i = threadIdx.y; i < kTile; i += kTileRows)
      for (int j = threadIdx.x; j < kTile; j += kHalfTile) {
        const int64_t src_row = c0 + i, src_col = r0 + j;
        float u = 0.f;
        if (src_row < rows && src_col < cols) {
          u = update_at(src_row * cols + src_col);
        }
        tile[i][j] = u;
      }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows)
      for (int j = threadIdx.x; j < kTile; j += kHalfTile) {
        const int64_t r = r0 + i, c = c0 + j;
        if (r < m && c < ld) dst[r * ld + c] = from_float<T>(c < n ? tile[j][i] * scale : 0.f);
      }
  } else {
    for (int i = threadIdx.y; i < kTile; i += kTileRows)
      for (int j = threadIdx.x; j < kTile; j += kHalfTile) {
        const int64_t r = r0 + i, c = c0 + j;
        if (r >= m || c >= ld) continue;
        float u = 0.f;
        if (c < n) u = update_at(r * cols + c) * scale;
        dst[r * ld + c] = from_float<T>(u);
      }
  }
}

// Tall matrices (rows > cols), vectorized: out[r][c] = U[c][r] over 64×64 tiles of the
// iterate (m = cols rows, ld columns). Reads grad/momentum rows as float4, writes the
// iterate's rows as 8 × 16-bit (uint4); columns [n, ld) get zeros.
// NOTE: cols % 4 == 0 and 16-byte aligned matrices (host-checked), ld % 8 == 0. On the
// H200 (Qwen2.5-0.5B, torch.profiler) the scalar kernel above moved the
// transposed gate/up matrices at about 3.1 TB/s, against 4.6 for the flat kernel.
template <typename T, bool kUpdateMomentum>
__global__ void normalized_update_transpose_vec_kernel(const __grid_constant__ Pointers ptrs, int64_t rows,
                                                       int64_t cols, Rule rule,
                                                       const float* __restrict__ scales,  // [count]
                                                       T* __restrict__ out, int64_t ld,   // [count, cols, ld]
                                                       const int* __restrict__ skip) {
  __shared__ float tile[kTile][kTile + 1];  // [U row − c0][U col − r0] (padded against bank conflicts)
  const int b = blockIdx.z, t = threadIdx.y * kHalfTile + threadIdx.x;
  const float* grad = ptrs.grad[b];
  float* momentum = ptrs.momentum[b];
  const bool skipped = is_skipped(skip);
  const float scale = skipped ? 0.f : scales[b];
  T* dst = out + static_cast<int64_t>(b) * cols * ld;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  // Phase 1: U rows c0 + i (of `rows`), columns r0 + 4j … + 3 (of `cols`): 16 float4 a row.
  for (int i = t / 16; i < kTile; i += kThreads / 16) {
    const int j = t % 16;
    const int64_t src_row = c0 + i, src_col = r0 + 4 * j;
    float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
    // NOTE: cols % 4 == 0: the float4 is whole.
    if (!skipped && src_row < rows && src_col < cols)
      u = update4_at<kUpdateMomentum>(grad, momentum, src_row * cols + src_col, rule);
    tile[i][4 * j] = u.x, tile[i][4 * j + 1] = u.y, tile[i][4 * j + 2] = u.z, tile[i][4 * j + 3] = u.w;
  }
  __syncthreads();
  // Phase 2: iterate rows r0 + i (of cols), columns c0 + 8q … + 7 (of ld): 8 uint4 a row.
  for (int i = t / 8; i < kTile; i += kThreads / 8) {
    const int q = t % 8;
    const int64_t r = r0 + i, c = c0 + 8 * q;
    if (r >= cols || c >= ld) continue;  // NOTE: ld % 8 == 0: the uint4 is whole
    float v[8];
    for (int e = 0; e < 8; ++e) v[e] = c + e < rows ? tile[8 * q + e][i] * scale : 0.f;
    const uint2 lo = pack4<T>(v[0], v[1], v[2], v[3]), hi = pack4<T>(v[4], v[5], v[6], v[7]);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
}

// ---------------------------------------------------------------- host side
// The list in launches of at most kMaxPerLaunch: fn(first, count_in_launch, pointers, vec4).
// vec4: every pointer of the launch is 16-byte aligned (the caller adds its own shape test).
template <typename Fn>
void for_each_launch(const StepMatrix* matrices, int64_t count, Fn&& fn) {
  for (int64_t first = 0; first < count; first += kMaxPerLaunch) {
    const int64_t n = std::min<int64_t>(kMaxPerLaunch, count - first);
    Pointers ptrs{};
    bool vec4 = true;
    for (int64_t k = 0; k < n; ++k) {
      const StepMatrix& s = matrices[first + k];
      ptrs.grad[k] = s.grad;
      ptrs.momentum[k] = s.momentum;
      vec4 = vec4 && aligned16(s.grad) && aligned16(s.momentum);
    }
    fn(first, n, ptrs, vec4);
  }
}

void check_shape(const char* what, int64_t count, int64_t rows, int64_t cols) {
  DMUON_CHECK(count >= 0 && rows >= 1 && cols >= 1 && rows * cols < (int64_t{1} << 40), what,
              ": invalid batch [", count, ", ", rows, ", ", cols, "]");
  DMUON_CHECK((rows + kTile - 1) / kTile <= 65535, what, ": ", rows, " rows exceed the grid limit");
}

unsigned flat_blocks(int64_t numel) {
  // NOTE: a grid-stride loop; 4 waves of 256-thread blocks on a 132-SM GPU keep every SM busy.
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((numel / 4 + kThreads - 1) / kThreads, 2048)));
}

dim3 tiles(int64_t tile_rows, int64_t tile_cols, int64_t count) {
  return dim3(static_cast<unsigned>((tile_cols + kTile - 1) / kTile),
              static_cast<unsigned>((tile_rows + kTile - 1) / kTile), static_cast<unsigned>(count));
}

}  // namespace

void normalized_update(DType dtype, const StepMatrix* matrices, int64_t count, int64_t rows,
                       int64_t cols, MomentumRule rule, bool update_momentum, const float* scales,
                       void* iterate, int64_t ld, cudaStream_t stream, const int* skip) {
  check_shape("normalized_update", count, rows, cols);
  const bool transpose = rows > cols;
  const int64_t m = transpose ? cols : rows, n = transpose ? rows : cols;
  DMUON_CHECK(ld >= n && ld % 8 == 0, "normalized_update: leading dimension ", ld, " for ", n, " columns");
  const Rule r = make_rule(rule);
  dispatch_half(dtype, [&](auto zero) {
    using T = decltype(zero);
    for_each_launch(matrices, count, [&](int64_t first, int64_t num, const Pointers& ptrs, bool vec4) {
      T* out = static_cast<T*>(iterate) + first * m * ld;
      const bool vec = vec4 && cols % 4 == 0;  // NOTE: whole, aligned float4s of every row
      if (!transpose && vec) {
        auto kernel = update_momentum ? normalized_update_flat_kernel<T, true> : normalized_update_flat_kernel<T, false>;
        kernel<<<dim3(flat_blocks(rows * cols), static_cast<unsigned>(num)), kThreads, 0, stream>>>(
            ptrs, rows, cols, r, scales + first, out, ld, skip);
      } else if (transpose && vec) {
        auto kernel = update_momentum ? normalized_update_transpose_vec_kernel<T, true>
                                      : normalized_update_transpose_vec_kernel<T, false>;
        kernel<<<tiles(m, ld, num), dim3(kHalfTile, kTileRows), 0, stream>>>(ptrs, rows, cols, r, scales + first, out, ld,
                                                                             skip);
      } else {
        auto kernel = transpose ? (update_momentum ? normalized_update_tile_kernel<T, true, true>
                                                   : normalized_update_tile_kernel<T, true, false>)
                                : (update_momentum ? normalized_update_tile_kernel<T, false, true>
                                                   : normalized_update_tile_kernel<T, false, false>);
        kernel<<<tiles(m, ld, num), dim3(kHalfTile, kTileRows), 0, stream>>>(ptrs, rows, cols, r, scales + first, out, ld,
                                                                             skip);
      }
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  });
}

}  // namespace dmuon::ns::cuda
