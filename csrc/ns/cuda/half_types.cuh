// dmuon/ns/cuda/half_types.cuh — the 16-bit element types of the NS iterate in kernels:
// conversions from and to fp32, and the host dispatch from DType to the element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ns/cuda/cuda_backend.h"

namespace dmuon::ns::cuda {

// fp32 → 16 bits, round to nearest even.
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// fn(T{}) with T the element type of `dtype` (__half or __nv_bfloat16).
template <typename Fn>
void dispatch_half(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat16) fn(__half{});
  else fn(__nv_bfloat16{});
}

}  // namespace dmuon::ns::cuda
