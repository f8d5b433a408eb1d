// dmuon/ns/cuda/tri_sym_product.cpp — the portable symmetric product (see tri_sym_product.h).
#include "ns/cuda/tri_sym_product.h"

#include "common/check.h"
#include "ns/cuda/cublaslt_gemm.h"
#include "ns/cuda/elementwise.h"
#include "ns/cuda/tri_plan.h"

namespace dmuon::ns::cuda {
namespace {

// The element `rows` rows of leading dimension `ld` into a 16-bit matrix.
const void* rows_into(const void* base, int64_t rows, int64_t ld) {
  return static_cast<const char*>(base) + 2 * rows * ld;
}

}  // namespace

void tri_sym_product(const SymProductArgs& args, int64_t block, void* lt_workspace, size_t lt_workspace_bytes,
                     cudaStream_t stream) {
  DMUON_CHECK(args.batch >= 1 && args.m >= 1 && args.k >= 1, "tri_sym_product: invalid shape [", args.batch, ", ",
              args.m, ", ", args.k, "]");
  const bool has_c = args.c != nullptr && args.beta != 0.0;
  for (const TriPanel& p : tri_panels(args.m, block)) {
    GemmDesc g = dense_desc(args);
    g.m = p.rows, g.n = p.cols;
    gemm(g, args.alpha, rows_into(args.a, p.row0, args.lda), args.b, has_c ? args.beta : 0.0,
         has_c ? rows_into(args.c, p.row0, args.ldc) : nullptr,
         const_cast<void*>(rows_into(args.d, p.row0, args.ldd)), lt_workspace, lt_workspace_bytes, stream);
  }
  mirror_lower(args.dtype, args.d, args.batch, args.m, args.ldd, args.stride_d, stream);
}

}  // namespace dmuon::ns::cuda
