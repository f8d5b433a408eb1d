// dmuon/ns/cuda/sm90_sym_product.h — the one-triangle symmetric product on sm_90a.
#pragma once

#include <cuda_runtime.h>

#include "ns/cuda/cuda_backend.h"

namespace dmuon::ns::cuda {

/// Configuration of the kernel (compile-time candidates; see sm90_sym_product.cu).
struct Sm90SymConfig {
  int tile = 128;    ///< square output tile (rows = cols)
  int tile_k = 64;   ///< k extent of one pipeline stage
  int stages = 5;    ///< TMA → WGMMA pipeline depth
  int num_ctas = 0;  ///< persistent CTAs (0: one per SM)
};

/// D = α·A·Bᵀ + β·C for a batch of m×m results whose exact value is symmetric: computes
/// the lower-triangle tiles only and writes each with its mirror. Requirements (checked):
/// leading dimensions and batch strides multiples of 8 elements, 16-byte aligned pointers.
void sm90_sym_product(const SymProductArgs& args, const Sm90SymConfig& config,
                      cudaStream_t stream);

}  // namespace dmuon::ns::cuda
