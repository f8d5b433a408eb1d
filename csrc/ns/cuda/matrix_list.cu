// dmuon/ns/cuda/matrix_list.cu — fused momentum, normalization and apply over matrix lists.
#include "ns/cuda/matrix_list.h"

#include <algorithm>

#include "ns/cuda/alignment.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/half_types.cuh"

namespace dmuon::ns::cuda {
namespace {

// Matrices per launch: their pointers travel in the kernel's parameters.
// NOTE: 64 × 3 pointers = 1.5 KiB, inside the classic 4 KiB parameter limit.
constexpr int kMaxPerLaunch = 64;
constexpr int kThreads = 256;
// Elements per partial sum of pass 1 (one block each).
// NOTE: 16384 keeps Qwen2.5-7B's largest matrix (3584 × 18944) at 4144 partials, which
// the reduction reads in a few microseconds, and still gives thousands of blocks per batch.
constexpr int64_t kChunk = 16384;
// Tile of the transposing kernels: 64×64 elements, 32×8 threads (each thread 2 columns,
// tx and tx + 32, of 8 rows).
// NOTE: on the H200 (2026-11-29) 32×32 tiles (4 elements a thread) moved the transposed
// Qwen2.5-0.5B gate/up matrices at 2.2 TB/s, half of what the untransposed kernels reach.
constexpr int kTile = 64;
constexpr int kTileRows = 8;
constexpr int kHalfTile = 32;
static_assert(kHalfTile * kTileRows == kThreads, "the tile kernels index their 32×8 threads as 0..kThreads−1");

struct Pointers {
  float* param[kMaxPerLaunch];
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
template <typename T>
__device__ __forceinline__ float unpack(uint32_t word, int half) {
  const uint16_t raw = static_cast<uint16_t>(word >> (16 * half));
  return to_float(*reinterpret_cast<const T*>(&raw));
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
// kernels of the stream) turns a pass into a no-op: no momentum or parameter is written and
// the iterate gets zeros. Null: never skipped.
__device__ __forceinline__ bool is_skipped(const int* skip) { return skip != nullptr && *skip != 0; }

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

// ---------------------------------------------------------------- pass 1
// Block (chunk, matrix): the new momentum and update of kChunk elements in registers
// (nothing is written), Σ U² into one partial, and whether the gradient or the momentum
// holds NaN/Inf. A null momentum reads as zeros (a buffer not created yet).
template <bool kVec4>
__global__ void check_partials_kernel(const __grid_constant__ Pointers ptrs, int64_t numel,
                                      int64_t num_chunks, Rule rule,
                                      float* __restrict__ partials,  // [count, num_chunks]
                                      int* __restrict__ flags) {     // [count, 2] or null
  const int b = blockIdx.y;
  const float* grad = ptrs.grad[b];
  const float* momentum = ptrs.momentum[b];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(numel, begin + kChunk);
  float acc = 0.f;
  bool grad_ok = true, momentum_ok = true;
  auto visit = [&](float g, float m_old) {
    grad_ok = grad_ok && isfinite(g);
    momentum_ok = momentum_ok && isfinite(m_old);
    const float u = update_of(g, lerp(m_old, g, rule.buffer_weight), rule);
    acc = fmaf(u, u, acc);
  };
  if constexpr (kVec4) {
    // NOTE: numel % 4 == 0 and 16-byte aligned rows, checked by the host.
    for (int64_t i = begin + 4 * threadIdx.x; i < end; i += 4 * kThreads) {
      const float4 g = *reinterpret_cast<const float4*>(grad + i);
      const float4 m = momentum != nullptr ? *reinterpret_cast<const float4*>(momentum + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      visit(g.x, m.x);
      visit(g.y, m.y);
      visit(g.z, m.z);
      visit(g.w, m.w);
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) visit(grad[i], momentum != nullptr ? momentum[i] : 0.f);
  }
  const float total = block_sum(acc);
  if (threadIdx.x == 0) partials[b * num_chunks + blockIdx.x] = total;
  if (flags != nullptr) {
    if (!grad_ok) atomicOr(flags + 2 * b, 1);
    if (!momentum_ok) atomicOr(flags + 2 * b + 1, 1);
  }
}

// Block b: scales[b] from its partials, in a fixed order.
__global__ void partials_to_scales_kernel(const float* __restrict__ partials,  // [count, num_chunks]
                                          int64_t num_chunks, float eps,
                                          float* __restrict__ scales) {  // [count]
  const float* mine = partials + static_cast<int64_t>(blockIdx.x) * num_chunks;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < num_chunks; i += kThreads) acc += mine[i];
  const float total = block_sum(acc);
  if (threadIdx.x == 0) scales[blockIdx.x] = 1.f / fmaxf(sqrtf(total), eps);
}

// ---------------------------------------------------------------- pass 2
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
// H200 (2026-11-29, Qwen2.5-0.5B, torch.profiler) the scalar kernel above moved the
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

// ---------------------------------------------------------------- pass 3
__device__ __forceinline__ float applied(float param, float o, float scale, float decay, bool& bad) {
  // NOTE: p·decay then + scale·O: the arithmetic of _foreach_mul_ and _foreach_add_(alpha).
  if (!isfinite(o)) {
    bad = true;
    o = 0.f;
  }
  return (decay != 1.f ? param * decay : param) + scale * o;
}

// rows ≤ cols (no transpose), 4 elements per thread (cols % 4 == 0, aligned).
template <typename T>
__global__ void apply_result_flat_kernel(const T* __restrict__ result,  // [count, rows, ld]
                                         int64_t ld, const __grid_constant__ Pointers ptrs,
                                         int64_t rows, int64_t cols, float scale, float decay,
                                         int* __restrict__ flag, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;
  const int b = blockIdx.y;
  float* param = ptrs.param[b];
  const T* src = result + static_cast<int64_t>(b) * rows * ld;
  const int64_t numel = rows * cols;
  bool bad = false;
  for (int64_t i = 4 * (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x); i < numel;
       i += 4 * static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / cols, c = i - r * cols;
    const uint2 o = *reinterpret_cast<const uint2*>(src + r * ld + c);
    float4 p = *reinterpret_cast<const float4*>(param + i);
    p.x = applied(p.x, unpack<T>(o.x, 0), scale, decay, bad);
    p.y = applied(p.y, unpack<T>(o.x, 1), scale, decay, bad);
    p.z = applied(p.z, unpack<T>(o.y, 0), scale, decay, bad);
    p.w = applied(p.w, unpack<T>(o.y, 1), scale, decay, bad);
    *reinterpret_cast<float4*>(param + i) = p;
  }
  if (bad) *flag = 1;
}

// Any shape: 64×64 tiles of the parameter; kTranspose → param[r][c] uses O[c][r].
template <typename T, bool kTranspose>
__global__ void apply_result_tile_kernel(const T* __restrict__ result,  // [count, m, ld]
                                         int64_t ld, const __grid_constant__ Pointers ptrs,
                                         int64_t rows, int64_t cols, float scale, float decay,
                                         int* __restrict__ flag, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;  // NOTE: the whole block returns, before any barrier
  __shared__ float tile[kTile][kTile + 1];  // [64, 65]
  const int b = blockIdx.z;
  float* param = ptrs.param[b];
  const int64_t m = kTranspose ? cols : rows;
  const T* src = result + static_cast<int64_t>(b) * m * ld;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  bool bad = false;
  if constexpr (kTranspose) {
    // Read O[c0+i][r0+j] (coalesced along O's rows); param[r0+i][c0+j] takes tile[j][i].
    for (int i = threadIdx.y; i < kTile; i += kTileRows)
      for (int j = threadIdx.x; j < kTile; j += kHalfTile) {
        const int64_t o_row = c0 + i, o_col = r0 + j;
        tile[i][j] = (o_row < cols && o_col < rows) ? to_float(src[o_row * ld + o_col]) : 0.f;
      }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows)
      for (int j = threadIdx.x; j < kTile; j += kHalfTile) {
        const int64_t r = r0 + i, c = c0 + j;
        if (r < rows && c < cols) param[r * cols + c] = applied(param[r * cols + c], tile[j][i], scale, decay, bad);
      }
  } else {
    for (int i = threadIdx.y; i < kTile; i += kTileRows)
      for (int j = threadIdx.x; j < kTile; j += kHalfTile) {
        const int64_t r = r0 + i, c = c0 + j;
        if (r < rows && c < cols)
          param[r * cols + c] = applied(param[r * cols + c], to_float(src[r * ld + c]), scale, decay, bad);
      }
  }
  if (bad) *flag = 1;
}

// Tall matrices (rows > cols), vectorized: param[r][c] uses O[c][r]; O's rows read as 8 ×
// 16-bit (uint4), the parameter's as float4.
// NOTE: cols % 4 == 0 and 16-byte aligned parameters (host-checked), ld % 8 == 0. The
// scalar kernel above moved the transposed Qwen2.5-0.5B gate/up matrices at about 1.7
// TB/s on the H200 (2026-11-29, torch.profiler), against 4 for the flat kernel.
template <typename T>
__global__ void apply_result_transpose_vec_kernel(const T* __restrict__ result,  // [count, cols, ld]
                                                  int64_t ld, const __grid_constant__ Pointers ptrs,
                                                  int64_t rows, int64_t cols, float scale, float decay,
                                                  int* __restrict__ flag, const int* __restrict__ skip) {
  if (is_skipped(skip)) return;  // NOTE: the whole block returns, before any barrier
  __shared__ float tile[kTile][kTile + 1];  // [O row − c0][O col − r0]
  const int b = blockIdx.z, t = threadIdx.y * kHalfTile + threadIdx.x;
  float* param = ptrs.param[b];
  const T* src = result + static_cast<int64_t>(b) * cols * ld;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  // Phase 1: O rows c0 + i (of cols), columns r0 + 8q … + 7 (of ld).
  for (int i = t / 8; i < kTile; i += kThreads / 8) {
    const int q = t % 8;
    const int64_t o_row = c0 + i, o_col = r0 + 8 * q;
    uint4 o = make_uint4(0u, 0u, 0u, 0u);
    if (o_row < cols && o_col < ld) o = *reinterpret_cast<const uint4*>(src + o_row * ld + o_col);
    const uint32_t words[4] = {o.x, o.y, o.z, o.w};
    for (int e = 0; e < 8; ++e) tile[i][8 * q + e] = unpack<T>(words[e / 2], e % 2);
  }
  __syncthreads();
  // Phase 2: parameter rows r0 + i (of rows), columns c0 + 4j … + 3 (of cols).
  bool bad = false;
  for (int i = t / 16; i < kTile; i += kThreads / 16) {
    const int j = t % 16;
    const int64_t r = r0 + i, c = c0 + 4 * j;
    if (r >= rows || c >= cols) continue;  // NOTE: cols % 4 == 0: the float4 is whole
    float4 p = *reinterpret_cast<const float4*>(param + r * cols + c);
    p.x = applied(p.x, tile[4 * j][i], scale, decay, bad);
    p.y = applied(p.y, tile[4 * j + 1][i], scale, decay, bad);
    p.z = applied(p.z, tile[4 * j + 2][i], scale, decay, bad);
    p.w = applied(p.w, tile[4 * j + 3][i], scale, decay, bad);
    *reinterpret_cast<float4*>(param + r * cols + c) = p;
  }
  if (bad) *flag = 1;
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
      ptrs.param[k] = s.param;
      ptrs.grad[k] = s.grad;
      ptrs.momentum[k] = s.momentum;
      vec4 = vec4 && aligned16(s.param) && aligned16(s.grad) && aligned16(s.momentum);
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

int64_t num_partials(int64_t count, int64_t rows, int64_t cols) {
  return count * std::max<int64_t>(1, (rows * cols + kChunk - 1) / kChunk);
}

void check_partials(const StepMatrix* matrices, int64_t count, int64_t rows, int64_t cols, MomentumRule rule,
                    float* partials, int* flags, cudaStream_t stream) {
  check_shape("check_partials", count, rows, cols);
  const int64_t numel = rows * cols;
  const int64_t num_chunks = std::max<int64_t>(1, (numel + kChunk - 1) / kChunk);
  const Rule r = make_rule(rule);
  for_each_launch(matrices, count, [&](int64_t first, int64_t n, const Pointers& ptrs, bool vec4) {
    const dim3 grid(static_cast<unsigned>(num_chunks), static_cast<unsigned>(n));
    float* out = partials + first * num_chunks;
    int* f = flags != nullptr ? flags + 2 * first : nullptr;
    if (vec4 && numel % 4 == 0)
      check_partials_kernel<true><<<grid, kThreads, 0, stream>>>(ptrs, numel, num_chunks, r, out, f);
    else
      check_partials_kernel<false><<<grid, kThreads, 0, stream>>>(ptrs, numel, num_chunks, r, out, f);
    DMUON_CHECK_CUDA(cudaGetLastError());
  });
}

void partials_to_scales(const float* partials, int64_t count, int64_t rows, int64_t cols, double eps,
                        float* scales, cudaStream_t stream) {
  check_shape("partials_to_scales", count, rows, cols);
  if (count == 0) return;
  const int64_t num_chunks = std::max<int64_t>(1, (rows * cols + kChunk - 1) / kChunk);
  partials_to_scales_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(
      partials, num_chunks, static_cast<float>(eps), scales);
  DMUON_CHECK_CUDA(cudaGetLastError());
}

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

void apply_result(DType dtype, const void* result, int64_t ld, const StepMatrix* matrices,
                  int64_t count, int64_t rows, int64_t cols, double scale, double decay,
                  int* nonfinite_flag, cudaStream_t stream, const int* skip) {
  check_shape("apply_result", count, rows, cols);
  const bool transpose = rows > cols;
  const int64_t m = transpose ? cols : rows, n = transpose ? rows : cols;
  DMUON_CHECK(ld >= n && ld % 8 == 0, "apply_result: leading dimension ", ld, " for ", n, " columns");
  dispatch_half(dtype, [&](auto zero) {
    using T = decltype(zero);
    for_each_launch(matrices, count, [&](int64_t first, int64_t num, const Pointers& ptrs, bool vec4) {
      const T* src = static_cast<const T*>(result) + first * m * ld;
      const float s = static_cast<float>(scale), d = static_cast<float>(decay);
      const bool vec = vec4 && cols % 4 == 0;  // NOTE: whole, aligned float4s of every row
      if (!transpose && vec) {
        apply_result_flat_kernel<T><<<dim3(flat_blocks(rows * cols), static_cast<unsigned>(num)), kThreads, 0,
                                      stream>>>(src, ld, ptrs, rows, cols, s, d, nonfinite_flag, skip);
      } else if (transpose && vec) {
        apply_result_transpose_vec_kernel<T><<<tiles(rows, cols, num), dim3(kHalfTile, kTileRows), 0, stream>>>(
            src, ld, ptrs, rows, cols, s, d, nonfinite_flag, skip);
      } else {
        auto kernel = transpose ? apply_result_tile_kernel<T, true> : apply_result_tile_kernel<T, false>;
        kernel<<<tiles(rows, cols, num), dim3(kHalfTile, kTileRows), 0, stream>>>(src, ld, ptrs, rows, cols, s, d,
                                                                             nonfinite_flag, skip);
      }
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  });
}

}  // namespace dmuon::ns::cuda
