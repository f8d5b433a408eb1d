// dmuon/ns/cuda/tri_sym_product.h — the portable symmetric products: the lower triangle's row
// panels or lower blocks (tri_plan.h) through cuBLASLt, then the mirror; run on every CUDA GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ns/cuda/sym_product_args.h"

namespace dmuon::ns::cuda {

/// D = α·A·Bᵀ + β·C for a batch of m×m results whose exact value is symmetric (the contract of
/// sm90_sym_product): the GEMMs of tri_panels(m, block) write the lower triangle (and the
/// upper part of each diagonal block), then the mirror writes every element above the
/// diagonal from its transpose, so every element of D is written and D is exactly symmetric.
/// C is read in the lower triangle and the diagonal blocks only. `block`: a positive multiple
/// of kTriBlockQuantum (checked). `lt_workspace` (may be null) is cuBLASLt's scratch.
void tri_sym_product(const SymProductArgs& args, int64_t block, void* lt_workspace, size_t lt_workspace_bytes,
                     cudaStream_t stream);

/// The same product through the lower blocks of block_plan(m, block) (one pointer-array
/// GEMM, then the remainder rows' panel, then the mirror). C is read in the lower triangle and
/// the diagonal blocks (the remainder's included) only. The pointer arrays take the head of
/// `lt_workspace`, which must hold them (checked).
void block_sym_product(const SymProductArgs& args, int64_t block, void* lt_workspace, size_t lt_workspace_bytes,
                       cudaStream_t stream);

}  // namespace dmuon::ns::cuda
