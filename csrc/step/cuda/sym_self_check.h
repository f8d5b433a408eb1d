// dmuon/step/cuda/sym_self_check.h — whether the sm_90a symmetric kernel may run on a GPU:
// built, compute capability 9.0, and its one-time numerical self-check passed there
// (torch-free); and the symmetric-product mode of a GPU's step.
#pragma once

#include <string>

#include "ns/cuda/cuda_backend.h"

namespace dmuon::step::cuda {

/// True when the kernel may serve the symmetric products of `dtype` on `device`; the
/// check runs once per (device, dtype) per process and warns once on stderr when it fails.
bool sym_kernel_usable(int device, ns::cuda::DType dtype);

/// The symmetric-product mode of `dtype` products on `device` (choose_sym_mode,
/// ns/cuda/autotune_rules.h; `forced`: DMUON_SYM_PATH's value, `sym_kernel`: the ops'
/// option); logs one line naming it once per (device, dtype, mode) per process.
ns::cuda::SymMode sym_mode_for(int device, ns::cuda::DType dtype, bool sym_kernel, const std::string& forced);

}  // namespace dmuon::step::cuda
