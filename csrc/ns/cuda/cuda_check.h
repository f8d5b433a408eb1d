// dmuon/ns/cuda/cuda_check.h — DMUON_CHECK for CUDA runtime and cuBLAS(Lt) status codes.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "common/check.h"

// Throw dmuon::Error (file:line, the call and the CUDA error string) on a runtime failure.
#define DMUON_CHECK_CUDA(expr)                                                              \
  do {                                                                                      \
    const cudaError_t dmuon_cuda_status_ = (expr);                                          \
    DMUON_CHECK(dmuon_cuda_status_ == cudaSuccess, #expr, " failed: ",                      \
                cudaGetErrorName(dmuon_cuda_status_), " (",                                 \
                cudaGetErrorString(dmuon_cuda_status_), ")");                               \
  } while (0)

// Throw on a cuBLAS / cuBLASLt failure, naming the status.
#define DMUON_CHECK_CUBLAS(expr)                                                            \
  do {                                                                                      \
    const cublasStatus_t dmuon_cublas_status_ = (expr);                                     \
    DMUON_CHECK(dmuon_cublas_status_ == CUBLAS_STATUS_SUCCESS, #expr, " failed: ",          \
                cublasGetStatusName(dmuon_cublas_status_), " (",                            \
                cublasGetStatusString(dmuon_cublas_status_), ")");                          \
  } while (0)
