// dmuon/step/cuda/sym_self_check.h — whether the sm_90a symmetric kernel may run on a GPU:
// built, compute capability 9.0, and its one-time numerical self-check passed there
// (torch-free).
#pragma once

#include "ns/cuda/cuda_backend.h"

namespace dmuon::step::cuda {

/// True when the kernel may serve the symmetric products of `dtype` on `device`; the
/// check runs once per (device, dtype) per process and warns once on stderr when it fails.
bool sym_kernel_usable(int device, ns::cuda::DType dtype);

}  // namespace dmuon::step::cuda
