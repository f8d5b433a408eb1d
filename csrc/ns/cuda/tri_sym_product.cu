// dmuon/ns/cuda/tri_sym_product.cu — the portable symmetric products (see tri_sym_product.h).
#include "ns/cuda/tri_sym_product.h"

#include <vector>

#include "common/check.h"
#include "ns/cuda/cublaslt_gemm.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/elementwise.h"
#include "ns/cuda/tri_plan.h"

namespace dmuon::ns::cuda {
namespace {

// The element `rows` rows of leading dimension `ld` into a 16-bit matrix.
const void* rows_into(const void* base, int64_t rows, int64_t ld) {
  return static_cast<const char*>(base) + 2 * rows * ld;
}

// The GEMM of one row panel: D[row0 : row0+rows, 0 : cols] = α·A[row0 : …]·B[0 : cols]ᵀ + β·C[same].
void panel_gemm(const SymProductArgs& args, const TriPanel& p, bool has_c, void* lt_workspace,
                size_t lt_workspace_bytes, cudaStream_t stream) {
  GemmDesc g = dense_desc(args);
  g.m = p.rows, g.n = p.cols;
  gemm(g, args.alpha, rows_into(args.a, p.row0, args.lda), args.b, has_c ? args.beta : 0.0,
       has_c ? rows_into(args.c, p.row0, args.ldc) : nullptr, const_cast<void*>(rows_into(args.d, p.row0, args.ldd)),
       lt_workspace, lt_workspace_bytes, stream);
}

// The pointers of the lower-block GEMM, four arrays `slot` pointers apart: A rows, B rows, C
// blocks (D's when C is not read), D blocks; `count` each.
__global__ void block_pointers_kernel(BlockStrides s, const char* a, const char* b, const char* c, char* d,
                                      int64_t count, int64_t slot, const void** ptrs) {  // [4, slot]
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= count) return;
  const BlockOffsets o = block_offsets(s, index);
  ptrs[index] = a + 2 * o.a;
  ptrs[slot + index] = b + 2 * o.b;
  ptrs[2 * slot + index] = c == nullptr ? d + 2 * o.d : c + 2 * o.c;
  ptrs[3 * slot + index] = d + 2 * o.d;
}

// The shape check of both products; whether they read C.
bool checked_reads_c(const SymProductArgs& args, const char* product) {
  DMUON_CHECK(args.batch >= 1 && args.m >= 1 && args.k >= 1, product, ": invalid shape [", args.batch, ", ", args.m,
              ", ", args.k, "]");
  return args.c != nullptr && args.beta != 0.0;
}

// NOTE: the pointer arrays take the head of the cuBLASLt workspace; above this share of it the
// product is refused (a batch of 64 matrices with 528 blocks each needs 1.1 MB).
constexpr size_t kMaxPointerBytes = size_t{8} << 20;

}  // namespace

void tri_sym_product(const SymProductArgs& args, int64_t block, void* lt_workspace, size_t lt_workspace_bytes,
                     cudaStream_t stream) {
  const bool has_c = checked_reads_c(args, "tri_sym_product");
  for (const TriPanel& p : tri_panels(args.m, block))
    panel_gemm(args, p, has_c, lt_workspace, lt_workspace_bytes, stream);
  mirror_lower(args.dtype, args.d, args.batch, args.m, args.ldd, args.stride_d, stream);
}

void block_sym_product(const SymProductArgs& args, int64_t block, void* lt_workspace, size_t lt_workspace_bytes,
                       cudaStream_t stream) {
  const bool has_c = checked_reads_c(args, "block_sym_product");
  const BlockPlan plan = block_plan(args.m, block);
  char* workspace = static_cast<char*>(lt_workspace);
  size_t workspace_bytes = lt_workspace == nullptr ? 0 : lt_workspace_bytes;
  if (plan.num_blocks > 0) {
    // Pointers of every lower block of every matrix, written on the device (stream-ordered, so
    // that a captured graph replays them), then one pointer-array GEMM.
    const int64_t count = args.batch * plan.num_blocks;
    const int64_t slot = (count + 31) / 32 * 32;  // NOTE: each array 256-byte aligned
    const size_t pointer_bytes = static_cast<size_t>(4 * slot) * sizeof(void*);
    DMUON_CHECK(workspace != nullptr && pointer_bytes <= kMaxPointerBytes && pointer_bytes < workspace_bytes,
                "block_sym_product: ", count, " blocks need ", pointer_bytes,
                " bytes of pointers at the head of the cuBLASLt workspace (", workspace_bytes, " bytes given)");
    const void** ptrs = reinterpret_cast<const void**>(workspace);
    workspace += pointer_bytes;
    workspace_bytes -= pointer_bytes;
    const BlockStrides s{block,        plan.num_blocks, args.lda, args.stride_a, args.ldb, args.stride_b,
                         has_c ? args.ldc : 0, has_c ? args.stride_c : 0, args.ldd, args.stride_d};
    constexpr int kThreads = 256;
    block_pointers_kernel<<<static_cast<unsigned>((count + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        s, static_cast<const char*>(args.a), static_cast<const char*>(args.b),
        has_c ? static_cast<const char*>(args.c) : nullptr, static_cast<char*>(args.d), count, slot, ptrs);
    DMUON_CHECK_CUDA(cudaGetLastError());
    GemmDesc g = dense_desc(args);
    g.m = g.n = block;
    g.batch = count;
    g.stride_a = g.stride_b = g.stride_c = g.stride_d = 0;
    g.pointer_array = true;
    // NOTE: block offsets are multiples of 256 bytes (block rows, block columns of 16-bit
    // elements); the bases and batch strides decide the rest.
    std::vector<uint64_t> offsets = {reinterpret_cast<uintptr_t>(args.a), reinterpret_cast<uintptr_t>(args.b),
                                     reinterpret_cast<uintptr_t>(args.d)};
    if (has_c) offsets.push_back(reinterpret_cast<uintptr_t>(args.c));
    if (args.batch > 1) {
      for (int64_t stride : {args.stride_a, args.stride_b, args.stride_d})
        offsets.push_back(2 * static_cast<uint64_t>(stride));
      if (has_c) offsets.push_back(2 * static_cast<uint64_t>(args.stride_c));
    }
    g.alignment = common_alignment(offsets);
    gemm(g, args.alpha, ptrs, ptrs + slot, has_c ? args.beta : 0.0, has_c ? ptrs + 2 * slot : nullptr,
         const_cast<void**>(ptrs + 3 * slot), workspace, workspace_bytes, stream);
  }
  if (plan.remainder.rows > 0) panel_gemm(args, plan.remainder, has_c, workspace, workspace_bytes, stream);
  mirror_lower(args.dtype, args.d, args.batch, args.m, args.ldd, args.stride_d, stream);
}

}  // namespace dmuon::ns::cuda
