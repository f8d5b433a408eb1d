// dmuon/ns/cuda/elementwise.cu — normalization, cast, transpose, a·I, mirror kernels.
#include "ns/cuda/elementwise.h"

#include <algorithm>
#include <cstring>

#include "ns/cuda/alignment.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/half_types.cuh"
#include "ns/cuda/tri_plan.h"

namespace dmuon::ns::cuda {
namespace {

// Tile of the transposing kernels: 32×32 elements, 32×8 threads (each thread 4 rows).
constexpr int kTile = 32;
constexpr int kTileRows = 8;
// NOTE: 256 threads and at most 4 blocks per SM-sized chunk of a matrix keep the
// reduction's atomics to a few thousand per step while still filling the GPU.
constexpr int kReduceThreads = 256;


// Block-wide sum of squares of one chunk of one matrix, one atomic per block.
__global__ void sum_squares_kernel(const float* __restrict__ x,  // [batch, numel]
                                   int64_t numel, float* __restrict__ out) {  // [batch]
  const float* matrix = x + static_cast<int64_t>(blockIdx.y) * numel;
  float acc = 0.f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = matrix[i];
    acc = fmaf(v, v, acc);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  __shared__ float warp_sums[kReduceThreads / 32];  // [warps]
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kReduceThreads / 32; ++w) total += warp_sums[w];
    atomicAdd(out + blockIdx.y, total);
  }
}

// out[b] (m×ld, T) = scale·in[b] in the wide orientation: in[b] is rows×cols (fp32);
// kTranspose → out[r][c] = in[c][r]. Columns c ∈ [n, ld) are zero-filled.
template <typename T, bool kTranspose>
__global__ void normalize_cast_kernel(const float* __restrict__ in,  // [batch, rows, cols]
                                      int64_t rows, int64_t cols,
                                      const float* __restrict__ sum_squares,  // [batch]
                                      float eps, T* __restrict__ out,  // [batch, m, ld]
                                      int64_t ld) {
  __shared__ float tile[kTile][kTile + 1];  // [32, 33] (padded against bank conflicts)
  const int64_t b = blockIdx.z;
  const int64_t m = kTranspose ? cols : rows, n = kTranspose ? rows : cols;
  const float scale = 1.f / fmaxf(sqrtf(sum_squares[b]), eps);
  const float* src = in + b * rows * cols;
  T* dst = out + b * m * ld;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  if constexpr (kTranspose) {
    // Read in[c0+i][r0+tx] (coalesced along in's columns), write out[r0+i][c0+tx].
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t src_row = c0 + i, src_col = r0 + threadIdx.x;
      tile[i][threadIdx.x] = (src_row < rows && src_col < cols) ? src[src_row * cols + src_col] : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < m && c < ld) dst[r * ld + c] = from_float<T>(c < n ? tile[threadIdx.x][i] * scale : 0.f);
    }
  } else {
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < m && c < ld) dst[r * ld + c] = from_float<T>(c < n ? src[r * cols + c] * scale : 0.f);
    }
  }
}

// out[b] (rows×cols fp32) from in[b] (m×ld, T): kTranspose → out[i][j] = in[j][i].
template <typename T, bool kTranspose>
__global__ void write_back_kernel(const T* __restrict__ in,  // [batch, m, ld]
                                  int64_t ld, int64_t rows, int64_t cols,
                                  float* __restrict__ out) {  // [batch, rows, cols]
  __shared__ float tile[kTile][kTile + 1];  // [32, 33]
  const int64_t b = blockIdx.z;
  const int64_t m = kTranspose ? cols : rows;
  const T* src = in + b * m * ld;
  float* dst = out + b * rows * cols;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  if constexpr (kTranspose) {
    // out[r0+i][c0+tx] = in[c0+tx][r0+i]: read in[c0+i][r0+tx] coalesced.
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t src_row = c0 + i, src_col = r0 + threadIdx.x;
      tile[i][threadIdx.x] = (src_row < m && src_col < rows) ? to_float(src[src_row * ld + src_col]) : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) dst[r * cols + c] = tile[threadIdx.x][i];
    }
  } else {
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) dst[r * cols + c] = to_float(src[r * ld + c]);
    }
  }
}

// q[b][r][c] = z[b][r][c] + (r == c ? a : 0), over [batch, m, m] with leading dimension ld.
template <typename T>
__global__ void add_identity_kernel(const T* __restrict__ z, float a, T* __restrict__ q,  // [batch, m, ld]
                                    int64_t m, int64_t ld, int64_t stride) {
  const int64_t b = blockIdx.y;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / m, c = i % m;
    const float v = to_float(z[b * stride + r * ld + c]) + (r == c ? a : 0.f);
    q[b * stride + r * ld + c] = from_float<T>(v);
  }
}

// The same, 8 elements (16 bytes) a thread: row r, columns 8k … 8k + 7 (the last chunk of a
// row stops at m). NOTE: ld and the batch stride multiples of 8, 16-byte aligned z and q
// (host-checked). The scalar kernel above moved Qwen2.5-0.5B's 896² Gram matrices at about
// 2.6 TB/s on the H200 (torch.profiler).
template <typename T>
__global__ void add_identity_vec_kernel(const T* __restrict__ z, float a, T* __restrict__ q,  // [batch, m, ld]
                                        int64_t m, int64_t ld, int64_t stride) {
  const int64_t b = blockIdx.y, chunks = (m + 7) / 8;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks, c = (i - r * chunks) * 8;
    const int64_t at = b * stride + r * ld + c;
    if (c + 8 <= m) {
      uint4 v = *reinterpret_cast<const uint4*>(z + at);
      if (r >= c && r < c + 8) {  // NOTE: the chunk that holds the diagonal element
        T* e = reinterpret_cast<T*>(&v);
        e[r - c] = from_float<T>(to_float(e[r - c]) + a);
      }
      *reinterpret_cast<uint4*>(q + at) = v;
    } else {
      for (int64_t e = 0; c + e < m; ++e) q[at + e] = from_float<T>(to_float(z[at + e]) + (r == c + e ? a : 0.f));
    }
  }
}

// Upper-triangle tiles (tile row < tile col, and the diagonal tiles' upper part) copy
// from the transposed lower triangle through shared memory; one block per upper tile
// (tri_plan.h's upper_tile).
template <typename T>
__global__ void mirror_lower_kernel(T* __restrict__ d,  // [batch, m, ld]
                                    int64_t m, int64_t ld, int64_t stride) {
  __shared__ T tile[kTile][kTile + 1];  // [32, 33]
  int64_t tr = 0, tc = 0;
  upper_tile(blockIdx.x, &tr, &tc);
  T* mat = d + static_cast<int64_t>(blockIdx.z) * stride;
  // Read the lower source tile (tile row tc, tile col tr).
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = tc * kTile + i, c = tr * kTile + threadIdx.x;
    if (r < m && c < m) tile[i][threadIdx.x] = mat[r * ld + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = tr * kTile + i, c = tc * kTile + threadIdx.x;
    if (r < m && c < m && r < c) mat[r * ld + c] = tile[threadIdx.x][i];
  }
}

dim3 tiles(int64_t rows, int64_t cols, int64_t batch) {
  DMUON_CHECK(batch <= 65535, "batch of ", batch, " matrices exceeds the grid limit 65535");
  return dim3(static_cast<unsigned>((cols + kTile - 1) / kTile),
              static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>(batch));
}

// Comparison of d against r, one block-reduction per block and a few atomics.
// stats: [0] max|d−r| (as uint bits), [1] max|r| (bits), [2] nonfinite, [3] asymmetric
// (all unsigned); sums: [0] Σ(d−r)², [1] Σr² (fp32 block sums accumulated in fp64).
template <typename T>
__global__ void compare_kernel(const T* __restrict__ d, const T* __restrict__ r,  // [batch, rows, ld]
                               int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                               bool check_symmetric, unsigned* __restrict__ stats,
                               double* __restrict__ sums) {
  const int64_t b = blockIdx.y;
  const T* dm = d + b * stride;
  const T* rm = r + b * stride;
  float max_diff = 0.f, max_ref = 0.f, sq_diff = 0.f, sq_ref = 0.f;
  unsigned nonfinite = 0, asym = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols, col = i % cols;
    const float dv = to_float(dm[row * ld + col]), rv = to_float(rm[row * ld + col]);
    if (!isfinite(dv)) {
      ++nonfinite;
    } else {
      max_diff = fmaxf(max_diff, fabsf(dv - rv));
      sq_diff = fmaf(dv - rv, dv - rv, sq_diff);
    }
    max_ref = fmaxf(max_ref, fabsf(rv));
    sq_ref = fmaf(rv, rv, sq_ref);
    if (check_symmetric) {
      const T a = dm[row * ld + col], t = dm[col * ld + row];
      if (*reinterpret_cast<const unsigned short*>(&a) != *reinterpret_cast<const unsigned short*>(&t)) ++asym;
    }
  }
  atomicMax(stats + 0, __float_as_uint(max_diff));  // NOTE: non-negative floats order like their bits
  atomicMax(stats + 1, __float_as_uint(max_ref));
  if (nonfinite) atomicAdd(stats + 2, nonfinite);
  if (asym) atomicAdd(stats + 3, asym);
  atomicAdd(sums + 0, static_cast<double>(sq_diff));
  atomicAdd(sums + 1, static_cast<double>(sq_ref));
}

}  // namespace

CompareStats compare_16bit(DType dtype, const void* d, const void* r, int64_t batch, int64_t rows,
                           int64_t cols, int64_t ld, int64_t stride, bool check_symmetric,
                           cudaStream_t stream) {
  DMUON_CHECK(!check_symmetric || rows == cols, "compare_16bit: symmetry needs square matrices");
  DMUON_CHECK(batch >= 1 && batch <= 65535, "compare_16bit: batch ", batch, " out of range");
  void* scratch = nullptr;
  DMUON_CHECK_CUDA(cudaMallocAsync(&scratch, 64, stream));
  unsigned* stats = static_cast<unsigned*>(scratch);
  double* sums = reinterpret_cast<double*>(static_cast<char*>(scratch) + 32);
  DMUON_CHECK_CUDA(cudaMemsetAsync(scratch, 0, 64, stream));
  const int64_t blocks = std::min<int64_t>((rows * cols + 255) / 256, 256);
  dispatch_half(dtype, [&](auto zero) {
    using T = decltype(zero);
    compare_kernel<T><<<dim3(static_cast<unsigned>(std::max<int64_t>(blocks, 1)), static_cast<unsigned>(batch)),
                        256, 0, stream>>>(static_cast<const T*>(d), static_cast<const T*>(r), rows, cols,
                                          ld, stride, check_symmetric, stats, sums);
  });
  DMUON_CHECK_CUDA(cudaGetLastError());
  unsigned host_stats[4];
  double host_sums[2];
  DMUON_CHECK_CUDA(cudaMemcpyAsync(host_stats, stats, sizeof(host_stats), cudaMemcpyDeviceToHost, stream));
  DMUON_CHECK_CUDA(cudaMemcpyAsync(host_sums, sums, sizeof(host_sums), cudaMemcpyDeviceToHost, stream));
  DMUON_CHECK_CUDA(cudaFreeAsync(scratch, stream));
  DMUON_CHECK_CUDA(cudaStreamSynchronize(stream));
  CompareStats out;
  float f;
  std::memcpy(&f, &host_stats[0], 4);
  out.max_abs_diff = f;
  std::memcpy(&f, &host_stats[1], 4);
  out.max_abs_ref = f;
  out.nonfinite = host_stats[2];
  out.asymmetric = host_stats[3];
  out.sum_sq_diff = host_sums[0];
  out.sum_sq_ref = host_sums[1];
  return out;
}

void sum_squares(const float* x, int64_t batch, int64_t numel, float* out, cudaStream_t stream) {
  DMUON_CHECK_CUDA(cudaMemsetAsync(out, 0, sizeof(float) * batch, stream));
  const int64_t blocks = std::min<int64_t>((numel + kReduceThreads * 8 - 1) / (kReduceThreads * 8), 512);
  sum_squares_kernel<<<dim3(static_cast<unsigned>(std::max<int64_t>(blocks, 1)), static_cast<unsigned>(batch)),
                       kReduceThreads, 0, stream>>>(x, numel, out);
  DMUON_CHECK_CUDA(cudaGetLastError());
}

void normalize_cast(DType dtype, const float* in, int64_t batch, int64_t rows, int64_t cols,
                    bool transpose, const float* sum_sq, double eps, void* out, int64_t ld_out,
                    cudaStream_t stream) {
  const int64_t m = transpose ? cols : rows;
  dispatch_half(dtype, [&](auto zero) {
    using T = decltype(zero);
    auto kernel = transpose ? normalize_cast_kernel<T, true> : normalize_cast_kernel<T, false>;
    kernel<<<tiles(m, ld_out, batch), dim3(kTile, kTileRows), 0, stream>>>(
        in, rows, cols, sum_sq, static_cast<float>(eps), static_cast<T*>(out), ld_out);
  });
  DMUON_CHECK_CUDA(cudaGetLastError());
}

void write_back(DType dtype, const void* in, int64_t ld_in, int64_t batch, int64_t rows,
                int64_t cols, bool transpose, float* out, cudaStream_t stream) {
  dispatch_half(dtype, [&](auto zero) {
    using T = decltype(zero);
    auto kernel = transpose ? write_back_kernel<T, true> : write_back_kernel<T, false>;
    kernel<<<tiles(rows, cols, batch), dim3(kTile, kTileRows), 0, stream>>>(
        static_cast<const T*>(in), ld_in, rows, cols, out);
  });
  DMUON_CHECK_CUDA(cudaGetLastError());
}

void add_identity(DType dtype, const void* z, double a, void* q, int64_t batch, int64_t m,
                  int64_t ld, int64_t stride, cudaStream_t stream) {
  const bool vec = ld % 8 == 0 && stride % 8 == 0 && aligned16(z) && aligned16(q);
  const int64_t work = vec ? m * ((m + 7) / 8) : m * m;
  const int64_t blocks = std::min<int64_t>((work + 255) / 256, 1024);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(batch));
  dispatch_half(dtype, [&](auto zero) {
    using T = decltype(zero);
    if (vec)
      add_identity_vec_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(z), static_cast<float>(a),
                                                           static_cast<T*>(q), m, ld, stride);
    else
      add_identity_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(z), static_cast<float>(a),
                                                       static_cast<T*>(q), m, ld, stride);
  });
  DMUON_CHECK_CUDA(cudaGetLastError());
}

void mirror_lower(DType dtype, void* d, int64_t batch, int64_t m, int64_t ld, int64_t stride,
                  cudaStream_t stream) {
  dispatch_half(dtype, [&](auto zero) {
    using T = decltype(zero);
    const dim3 grid = tiles(m, m, batch);
    mirror_lower_kernel<T><<<dim3(static_cast<unsigned>(num_upper_tiles(grid.x)), 1, grid.z),
                             dim3(kTile, kTileRows), 0, stream>>>(static_cast<T*>(d), m, ld, stride);
  });
  DMUON_CHECK_CUDA(cudaGetLastError());
}

}  // namespace dmuon::ns::cuda
