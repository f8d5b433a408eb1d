// dmuon/step/cuda/normuon_kernels.cu — NorMuon's two passes over an NS result (see
// normuon_kernels.h for the rule and its launches).
#include "step/cuda/normuon_kernels.h"

#include <cstdint>

#include "ns/cuda/cuda_check.h"
#include "step/cuda/kernel_common.cuh"

namespace dmuon::step::cuda {
namespace {

constexpr int kWarps = kThreads / 32;
// Row sums of tall items: 32×8 threads, each 8 item rows (one 16-byte load) per storage row.
constexpr int kTallRows = 8;

// ---------------------------------------------------------------- vector loads
// kVec consecutive elements as floats: one 16-byte load when kVec · sizeof(T) is 16.
template <typename T, int kVec>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[kVec]) {
  if constexpr (kVec == 1) {
    out[0] = load(p, 0);
  } else {
    static_assert(sizeof(T) * kVec == 16, "a vector load is 16 bytes");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
    for (int i = 0; i < kVec; ++i) out[i] = load(e, i);
  }
}

// Sum over the block in a fixed order (warp trees, then warps in order), in every thread.
__device__ double block_sum_all(double value) {
  __shared__ double warp_sums[kWarps];
  __shared__ double total;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kWarps; ++w) t += warp_sums[w];
    total = t;
  }
  __syncthreads();
  const double out = total;
  __syncthreads();  // NOTE: the shared slots are reused by the next call
  return out;
}

// ---------------------------------------------------------------- row sums
// Wide items (rows ≤ cols): item row r is storage row r; one warp per row.
template <typename T, int kVec>
__global__ void row_sums_wide_kernel(const T* __restrict__ result, int64_t ld, int64_t stride, int64_t rows,
                                     int64_t cols, const __grid_constant__ DescList<NormuonDesc> list,
                                     float* __restrict__ sums) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* row = result + list.d[blockIdx.y].matrix_idx * stride + r * ld;
  const int64_t full = cols / kVec * kVec;
  float acc = 0.f;
  for (int64_t c = static_cast<int64_t>(lane) * kVec; c < full; c += 32 * kVec) {
    float x[kVec];
    load_vec<T, kVec>(row + c, x);
    for (int i = 0; i < kVec; ++i) acc = fmaf(x[i], x[i], acc);
  }
  for (int64_t c = full + lane; c < cols; c += 32) {
    const float x = load(row, c);
    acc = fmaf(x, x, acc);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (lane == 0) sums[static_cast<int64_t>(blockIdx.y) * rows + r] = acc;
}

// Tall items (rows > cols): item row r is storage column r, the cols storage rows below
// each other; thread (x, y) sums item rows [r, r + kVec) over storage rows y, y + 8, ...
template <typename T, int kVec>
__global__ void row_sums_tall_kernel(const T* __restrict__ result, int64_t ld, int64_t stride, int64_t rows,
                                     int64_t cols, const __grid_constant__ DescList<NormuonDesc> list,
                                     float* __restrict__ sums) {
  __shared__ float part[kTallRows][32 * kVec];
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * kVec;
  const T* base = result + list.d[blockIdx.y].matrix_idx * stride;
  float acc[kVec] = {};
  if (r < rows) {
    const bool whole = r + kVec <= rows;
    for (int64_t j = threadIdx.y; j < cols; j += kTallRows) {
      const T* p = base + j * ld + r;
      if (whole) {
        float x[kVec];
        load_vec<T, kVec>(p, x);
        for (int i = 0; i < kVec; ++i) acc[i] = fmaf(x[i], x[i], acc[i]);
      } else {
        for (int i = 0; r + i < rows; ++i) acc[i] = fmaf(load(p, i), load(p, i), acc[i]);
      }
    }
  }
  for (int i = 0; i < kVec; ++i) part[threadIdx.y][threadIdx.x * kVec + i] = acc[i];
  __syncthreads();
  if (threadIdx.y != 0 || r >= rows) return;
  float* out = sums + static_cast<int64_t>(blockIdx.y) * rows;
  for (int i = 0; i < kVec && r + i < rows; ++i) {
    float total = 0.f;
    for (int y = 0; y < kTallRows; ++y) total += part[y][threadIdx.x * kVec + i];
    out[r + i] = total;
  }
}

// ---------------------------------------------------------------- moments
// v_next and the divisor √v_next + ε of row r (recomputed alike in both loops below).
__device__ __forceinline__ float next_moment(float v, float row_sq, int64_t cols, double beta2) {
  return static_cast<float>(beta2 * static_cast<double>(v) +
                            (1.0 - beta2) * (static_cast<double>(row_sq) / static_cast<double>(cols)));
}

// One block per matrix: ‖O‖², ‖Ô‖², the row factors keep/d_i (at the matrix's place in the
// batch) and v, or the flag.
__global__ void moments_kernel(const __grid_constant__ DescList<NormuonDesc> list, const float* __restrict__ sums,
                               float* __restrict__ factors, int* __restrict__ marked, int64_t rows, int64_t cols,
                               double beta2, double eps, int* __restrict__ flags, const int* __restrict__ skip) {
  const NormuonDesc& d = list.d[blockIdx.x];
  const float* s = sums + static_cast<int64_t>(blockIdx.x) * rows;
  double norm_sq = 0.0, hat_sq = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const double den = sqrt(static_cast<double>(next_moment(d.v[r], s[r], cols, beta2))) + eps;
    norm_sq += s[r];
    hat_sq += static_cast<double>(s[r]) / (den * den);
  }
  norm_sq = block_sum_all(norm_sq);
  hat_sq = block_sum_all(hat_sq);
  const bool skipped = is_skipped(skip), finite = isfinite(norm_sq);
  // NOTE: O = 0 has ‖Ô‖ = 0: v moves, O stays (the factor would be 0/0), as the CPU rule.
  if (threadIdx.x == 0) {
    marked[d.matrix_idx] = !skipped && finite && hat_sq > 0.0;
    if (!skipped && !finite) flags[d.flag_idx] = 1;
  }
  if (skipped || !finite) return;
  const double keep = hat_sq > 0.0 ? sqrt(norm_sq / hat_sq) : 1.0;
  float* f = factors + d.matrix_idx * rows;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const float v_next = next_moment(d.v[r], s[r], cols, beta2);
    f[r] = static_cast<float>(keep / (sqrt(static_cast<double>(v_next)) + eps));
    d.v[r] = v_next;
  }
}

template <typename T, int kVec>
void row_sums(const IterateView& it, const DescList<NormuonDesc>& list, float* sums, cudaStream_t stream) {
  const T* data = static_cast<const T*>(it.data);
  const unsigned n = static_cast<unsigned>(list.n);
  if (it.transposed()) {
    const int64_t per_block = int64_t{32} * kVec;
    row_sums_tall_kernel<T, kVec><<<dim3(static_cast<unsigned>((it.rows + per_block - 1) / per_block), n),
                                    dim3(32, kTallRows), 0, stream>>>(data, it.ld, it.stride, it.rows, it.cols, list,
                                                                      sums);
  } else {
    row_sums_wide_kernel<T, kVec><<<dim3(static_cast<unsigned>((it.rows + kWarps - 1) / kWarps), n), kThreads, 0,
                                    stream>>>(data, it.ld, it.stride, it.rows, it.cols, list, sums);
  }
  DMUON_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

int64_t normuon_scratch_bytes(int64_t listed, int64_t count, int64_t rows) {
  return static_cast<int64_t>(sizeof(float)) * (listed + count) * rows + static_cast<int64_t>(sizeof(int)) * count;
}

RowScale normuon(const IterateView& it, int64_t count, const std::vector<NormuonDesc>& matrices, double beta2,
                 double eps, void* scratch, int* flags, const int* skip, cudaStream_t stream) {
  DMUON_CHECK(it.rows >= 1 && it.cols >= 1 && count >= 1 && scratch != nullptr, "normuon: a batch of ", count, " ",
              it.rows, "x", it.cols, " results without scratch");
  const int64_t listed = static_cast<int64_t>(matrices.size());
  float* sums = static_cast<float*>(scratch);
  float* factors = sums + listed * it.rows;
  int* scaled = reinterpret_cast<int*>(factors + count * it.rows);
  DMUON_CHECK_CUDA(cudaMemsetAsync(scaled, 0, sizeof(int) * static_cast<size_t>(count), stream));
  for (const NormuonDesc& d : matrices)
    DMUON_CHECK(d.matrix_idx >= 0 && d.matrix_idx < count, "normuon: matrix ", d.matrix_idx, " of ", count);
  // NOTE: 16-byte loads need the result, its ld and its batch stride in 8-element steps
  // (the NS iterate's padded ld is); anything else takes the element-wise loads.
  const bool vec = reinterpret_cast<uintptr_t>(it.data) % 16 == 0 && it.ld % 8 == 0 && it.stride % 8 == 0;
  dispatch_half(it.dtype, [&](auto tz) {
    using T = decltype(tz);
    for_each_launch(matrices, [&](const DescList<NormuonDesc>& list, size_t first) {
      float* at = sums + static_cast<int64_t>(first) * it.rows;
      if (vec)
        row_sums<T, 8>(it, list, at, stream);
      else
        row_sums<T, 1>(it, list, at, stream);
      moments_kernel<<<static_cast<unsigned>(list.n), kThreads, 0, stream>>>(list, at, factors, scaled, it.rows,
                                                                             it.cols, beta2, eps, flags, skip);
      DMUON_CHECK_CUDA(cudaGetLastError());
    });
  });
  return {factors, scaled};
}

}  // namespace dmuon::step::cuda
