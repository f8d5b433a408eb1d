// dmuon/ns/cuda/cublaslt_gemm.cpp — cuBLASLt plans (descriptors, layouts, heuristic
// algorithm) cached per problem descriptor and device.
#include "ns/cuda/cublaslt_gemm.h"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "ns/cuda/cuda_check.h"

namespace dmuon::ns::cuda {
namespace {

// NOTE: the autotuner times up to this many of the heuristic's algorithms per problem.
constexpr int kMaxAlgos = 8;

// One cached cuBLASLt plan: descriptors and the heuristic's algorithm.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;  // heuristic order, at most kMaxAlgos
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

using Key = std::tuple<int, int, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, size_t>;

std::mutex g_mutex;
std::map<int, cublasLtHandle_t> g_handles;            // device → handle (never destroyed)
std::map<Key, std::unique_ptr<Plan>> g_plans;         // guarded by g_mutex

// A column-major cuBLASLt layout of rows×cols with leading dimension ld, batched (strided, or
// through pointer arrays).
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride, bool pointer_array) {
  cublasLtMatrixLayout_t layout = nullptr;
  DMUON_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                static_cast<uint64_t>(cols), ld));
  const int32_t count = static_cast<int32_t>(batch);
  DMUON_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof(count)));
  if (pointer_array) {
    const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    DMUON_CHECK_CUBLAS(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
    return layout;
  }
  DMUON_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  return layout;
}

// Build the plan of a descriptor. NOTE: row-major D = A·op(B) is the column-major
// product Dᵀ = op(B)ᵀ·Aᵀ, so cuBLASLt's first operand is B's buffer and its second A's.
std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const GemmDesc& g, size_t workspace_bytes) {
  const cudaDataType_t type = g.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  auto plan = std::make_unique<Plan>();
  DMUON_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_first = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_second = CUBLAS_OP_N;
  DMUON_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                    &trans_first, sizeof(trans_first)));
  DMUON_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                    &trans_second, sizeof(trans_second)));
  // First operand: B's buffer, column-major n×k (k×n when transposed).
  const bool ptrs = g.pointer_array;
  plan->a = g.transpose_b ? make_layout(type, g.k, g.n, g.ldb, g.batch, g.stride_b, ptrs)
                          : make_layout(type, g.n, g.k, g.ldb, g.batch, g.stride_b, ptrs);
  // Second operand: A's buffer, column-major k×m.
  plan->b = make_layout(type, g.k, g.m, g.lda, g.batch, g.stride_a, ptrs);
  plan->c = make_layout(type, g.n, g.m, g.ldc, g.batch, g.stride_c, ptrs);
  plan->d = make_layout(type, g.n, g.m, g.ldd, g.batch, g.stride_d, ptrs);

  cublasLtMatmulPreference_t pref = nullptr;
  DMUON_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  DMUON_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
  if (ptrs) {
    // NOTE: the heuristic cannot see the pointers of an array; it assumes 256-byte alignment
    // unless told the alignment they have.
    const uint32_t alignment = static_cast<uint32_t>(g.alignment);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      DMUON_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof(alignment)));
  }
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos] = {};
  int num_results = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, plan->op, plan->a, plan->b, plan->c, plan->d, pref, kMaxAlgos, results, &num_results);
  cublasLtMatmulPreferenceDestroy(pref);
  DMUON_CHECK_CUBLAS(status);
  DMUON_CHECK(num_results > 0, "cuBLASLt has no algorithm for the ", g.batch, "x", g.m, "x",
              g.n, "x", g.k, " product");
  for (int i = 0; i < num_results; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->algos.push_back(results[i].algo);
  DMUON_CHECK(!plan->algos.empty(), "cuBLASLt offers no usable algorithm for the ", g.batch, "x",
              g.m, "x", g.n, "x", g.k, " product");
  return plan;
}

}  // namespace

namespace {

// The cached plan of a (normalized) descriptor on the current device.
Plan* plan_for(const GemmDesc& desc, size_t workspace_bytes, cublasLtHandle_t* handle_out) {
  int device = 0;
  DMUON_CHECK_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& h = g_handles[device];
  if (h == nullptr) DMUON_CHECK_CUBLAS(cublasLtCreate(&h));
  *handle_out = h;
  const Key key{device, static_cast<int>(desc.dtype), desc.transpose_b, desc.batch, desc.m,
                desc.n, desc.k, desc.lda, desc.stride_a, desc.ldb, desc.stride_b, desc.ldc,
                desc.stride_c, desc.ldd, desc.stride_d, desc.pointer_array ? desc.alignment : 0, workspace_bytes};
  auto& slot = g_plans[key];
  if (!slot) slot = make_plan(h, desc, workspace_bytes);
  return slot.get();
}

}  // namespace

GemmDesc dense_desc(const SymProductArgs& args) {
  GemmDesc g;
  g.dtype = args.dtype;
  g.transpose_b = true;
  g.batch = args.batch, g.m = args.m, g.n = args.m, g.k = args.k;
  g.lda = args.lda, g.stride_a = args.stride_a, g.ldb = args.ldb, g.stride_b = args.stride_b;
  g.ldc = args.ldc, g.stride_c = args.stride_c, g.ldd = args.ldd, g.stride_d = args.stride_d;
  return g;
}

int gemm_num_algos(const GemmDesc& g, bool has_c, size_t workspace_bytes) {
  GemmDesc desc = g;
  if (!has_c) desc.ldc = desc.ldd, desc.stride_c = desc.stride_d;
  cublasLtHandle_t handle = nullptr;
  return static_cast<int>(plan_for(desc, workspace_bytes, &handle)->algos.size());
}

void gemm(const GemmDesc& g, double alpha, const void* a, const void* b, double beta,
          const void* c, void* d, void* workspace, size_t workspace_bytes, cudaStream_t stream,
          int algo_idx) {
  DMUON_CHECK(g.batch >= 1 && g.m >= 1 && g.n >= 1 && g.k >= 1, "gemm: invalid shape [", g.batch,
              ", ", g.m, ", ", g.n, ", ", g.k, "]");
  if (workspace == nullptr) workspace_bytes = 0;
  GemmDesc desc = g;
  if (c == nullptr || beta == 0.0) {  // NOTE: C is then never read; D's layout stands in.
    c = d;
    desc.ldc = desc.ldd;
    desc.stride_c = desc.stride_d;
    beta = 0.0;
  }
  cublasLtHandle_t handle = nullptr;
  Plan* plan = plan_for(desc, workspace_bytes, &handle);
  DMUON_CHECK(algo_idx >= 0 && algo_idx < static_cast<int>(plan->algos.size()), "gemm: algorithm ",
              algo_idx, " of ", plan->algos.size());
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  DMUON_CHECK_CUBLAS(cublasLtMatmul(handle, plan->op, &alpha_f, b, plan->a, a, plan->b, &beta_f,
                                    c, plan->c, d, plan->d, &plan->algos[static_cast<size_t>(algo_idx)],
                                    workspace, workspace_bytes, stream));
}

}  // namespace dmuon::ns::cuda
