// dmuon/ns/cuda/sm90_sym_product.h — the one-triangle symmetric product on sm_90a.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "ns/cuda/cuda_backend.h"
#include "ns/cuda/sm90_sym_config.h"

namespace dmuon::ns::cuda {

/// sm90_sym_config_rejects (sm90_sym_config.h) on the current device (its SM count is
/// queried for the split-K configurations only).
std::string sm90_sym_config_rejects(const SymProductArgs& args, const Sm90SymConfig& config);

/// D = α·A·Bᵀ + β·C for a batch of m×m results whose exact value is symmetric: computes
/// the lower-triangle tiles only and writes each with its mirror. Requirements (checked):
/// leading dimensions and batch strides multiples of 8 elements, 16-byte aligned pointers.
void sm90_sym_product(const SymProductArgs& args, const Sm90SymConfig& config,
                      cudaStream_t stream);

namespace sm90 {
// The instances of one element type (sm90_sym_product_{f16,bf16}.cu); false: not built.
bool launch_f16(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream);
bool launch_bf16(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream);
}  // namespace sm90

}  // namespace dmuon::ns::cuda
