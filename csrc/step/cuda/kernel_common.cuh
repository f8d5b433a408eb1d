// dmuon/step/cuda/kernel_common.cuh — what the step's CUDA kernel files share: element
// loads and rounding of float32 / bfloat16 / float16, the gate test, descriptor lists
// passed in kernel parameters, and the host-side dtype dispatch. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/check.h"
#include "step/cuda/piece_kernels.h"
#include "step/types.h"

namespace dmuon::step::cuda {
namespace {

/// Threads of the one-dimensional blocks.
constexpr int kThreads = 256;

// ---------------------------------------------------------------- elements
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// Whether element i is finite, in its own precision (a large double is not an fp32 Inf).
template <typename T>
__device__ __forceinline__ bool finite_at(const T* p, int64_t i) {
  return isfinite(load(p, i));
}
template <>
__device__ __forceinline__ bool finite_at<double>(const double* p, int64_t i) {
  return isfinite(p[i]);
}

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// v as a T tensor holds it.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  const T t = from_f<T>(v);
  return load(&t, 0);
}

// Whether the gate (device int, may be null) is closed: the writing passes write nothing.
__device__ __forceinline__ bool is_skipped(const int* skip) { return skip != nullptr && *skip != 0; }

// Element i of a view of rows of `row_len` elements, `ld` apart (contiguous when ld ≤ row_len).
__device__ __forceinline__ int64_t strided_at(int64_t i, int64_t row_len, int64_t ld) {
  return ld > row_len && row_len > 0 ? (i / row_len) * ld + i % row_len : i;
}

// Descriptors of one launch, in the kernel's parameters.
template <typename D>
struct DescList {
  D d[kMaxPiecesPerLaunch];
  int n = 0;
};

// fn(list, first) for every launch-sized part of `all`.
template <typename D, typename Fn>
void for_each_launch(const std::vector<D>& all, Fn&& fn) {
  for (size_t first = 0; first < all.size(); first += kMaxPiecesPerLaunch) {
    DescList<D> list;
    list.n = static_cast<int>(std::min<size_t>(kMaxPiecesPerLaunch, all.size() - first));
    for (int k = 0; k < list.n; ++k) list.d[k] = all[first + static_cast<size_t>(k)];
    fn(list, first);
  }
}

// fn(T{}) with T the CUDA element type of a float32 / bfloat16 / float16 dtype.
template <typename Fn>
void dispatch(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(float{}); return;
    case DType::kBFloat16: fn(__nv_bfloat16{}); return;
    case DType::kFloat16: fn(__half{}); return;
    default: break;
  }
  DMUON_FAIL("the CUDA step ops handle float32, bfloat16 and float16 elements, not ", dtype_name(dtype));
}
template <typename Fn>
void dispatch_half(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat16) return fn(__half{});
  if (dtype == DType::kBFloat16) return fn(__nv_bfloat16{});
  DMUON_FAIL("an NS iterate is float16 or bfloat16, not ", dtype_name(dtype));
}

}  // namespace
}  // namespace dmuon::step::cuda
