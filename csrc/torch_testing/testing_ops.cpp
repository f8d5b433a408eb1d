// dmuon/torch_testing/testing_ops.cpp — torch.ops.dmuon_testing.*, CUDA builds: the CUDA
// backend's parts for tests and benchmarks (one symmetric product, the kernel configurations,
// cuBLASLt's algorithms, the autotuner's counters); never used by the product. The
// namespace's orthogonalize op and graph caches' counters: orthogonalize_op.cpp.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ns/cuda/autotune.h"
#include "ns/cuda/autotune_rules.h"
#include "ns/cuda/cuda_backend.h"
#include "ns/cuda/sm90_sym_config.h"
#include "step/cuda/sym_self_check.h"
#include "torch_testing/op_errors.h"

namespace dmuon::torch_adapter {
namespace {

ns::cuda::DType half_dtype(const std::string& name) {
  DMUON_CHECK(name == "float16" || name == "bfloat16", "dtype must be float16 or bfloat16, got '", name, "'");
  return name == "float16" ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
}

// D [B, m, m] (a view with rows padded to 8 elements, TMA alignment) for CUDA [B, m, k]
// A and B of one 16-bit dtype and C [B, m, m] or none; NaN first when `poison` (every
// element must be written).
// NOTE: the benchmarks turn the poison off so that the timed call holds the product
// alone, as cuBLAS's does.
std::pair<at::Tensor, ns::cuda::SymProductArgs> sym_args(const at::Tensor& a, const at::Tensor& b,
                                                         const std::optional<at::Tensor>& c, double alpha,
                                                         double beta, bool poison) {
  DMUON_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 3 && b.sizes() == a.sizes() &&
                  a.scalar_type() == b.scalar_type() && a.stride(2) == 1 && b.stride(2) == 1,
              "A and B must be CUDA [B, m, k] tensors of one dtype with unit column stride");
  const int64_t batch = a.size(0), m = a.size(1);
  at::Tensor d = at::empty({batch, m, ns::cuda::padded_ld(m)}, a.options()).narrow(2, 0, m);
  if (poison) d.fill_(std::numeric_limits<double>::quiet_NaN());
  DMUON_CHECK(!c || (c->sizes() == d.sizes() && c->scalar_type() == a.scalar_type() && c->stride(2) == 1),
              "C must be [B, m, m] of A's dtype");
  ns::cuda::SymProductArgs args;
  args.dtype = a.scalar_type() == at::kHalf ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
  args.batch = batch, args.m = m, args.k = a.size(2);
  args.a = a.data_ptr(), args.lda = a.stride(1), args.stride_a = a.stride(0);
  args.b = b.data_ptr(), args.ldb = b.stride(1), args.stride_b = b.stride(0);
  if (c) args.c = c->data_ptr(), args.ldc = c->stride(1), args.stride_c = c->stride(0);
  args.d = d.data_ptr(), args.ldd = d.stride(1), args.stride_d = d.stride(0);
  args.alpha = alpha;
  args.beta = c ? beta : 0.0;
  return {d, args};
}

// D = α·A·Bᵀ + β·C with the sm_90a kernel (use_kernel) or the dense cuBLASLt product mirrored.
at::Tensor sym_product_op(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c, double alpha,
                          double beta, bool use_kernel) {
  return translate_errors([&] {
    c10::cuda::CUDAGuard guard(a.device());
    auto [d, args] = sym_args(a, b, c, alpha, beta, /*poison=*/true);
    ns::cuda::sym_product(args, use_kernel ? ns::cuda::SymMode::kKernel : ns::cuda::SymMode::kDenseMirror,
                          at::cuda::getCurrentCUDAStream());
    return d;
  });
}

// The same product with one named configuration ("sm90:…" or "lt:<i>").
at::Tensor sym_product_config_op(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                                 double alpha, double beta, c10::string_view config, bool poison) {
  return translate_errors([&] {
    c10::cuda::CUDAGuard guard(a.device());
    auto [d, args] = sym_args(a, b, c, alpha, beta, poison);
    // NOTE: cuBLASLt candidates get a scratch workspace like the backend's.
    constexpr size_t kLtBytes = ns::cuda::kCublasWorkspaceBytes;
    at::Tensor lt_ws = at::empty({static_cast<int64_t>(kLtBytes)}, a.options().dtype(at::kByte));
    ns::cuda::sym_product_with(args, std::string(config), lt_ws.data_ptr(), kLtBytes, at::cuda::getCurrentCUDAStream());
    return d;
  });
}

std::vector<std::string> sym_configs_op() {
  std::vector<std::string> names;
  if (!ns::cuda::sym_kernel_built()) return names;
  for (const auto& c : ns::cuda::sm90_sym_configs()) names.push_back(c.name());
  return names;
}

// The portable products' candidate configurations for m×m products: those the tuner tries where
// DMUON_SYM_PATH=portable (lower blocks, then row panels; the default alone where there is none).
std::vector<std::string> sym_portable_configs_op(int64_t m) {
  ns::cuda::SymProductArgs args;
  args.m = m;
  return ns::cuda::sym_candidates(args, ns::cuda::SymMode::kPortableOnly, /*kernel_built=*/false, {}, 0, 0);
}

bool sym_kernel_usable_op(const at::Tensor& x, c10::string_view dtype) {
  return translate_errors(
      [&] { return step::cuda::sym_kernel_usable(x.get_device(), half_dtype(std::string(dtype))); });
}

int64_t autotune_measurements_op(const at::Tensor&) { return ns::cuda::Autotuner::instance().num_measurements(); }

// The time in ms of every algorithm cuBLASLt's heuristic offers for D = A·op(B) + β·C
// (A [batch, m, k]; B [batch, k, n], or [batch, n, k] when transpose_b), timed in turns as
// the autotuner times its candidates; NaN for an algorithm that failed to run.
// NOTE: for the benchmarks' floor at GEMM rates: the results are not checked, so a wrong
// but fast algorithm could only lower that floor.
std::vector<double> gemm_algo_ms_op(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                                    double beta, bool transpose_b) {
  return translate_errors([&] {
    DMUON_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 3 && b.dim() == 3 && a.is_contiguous() &&
                    b.is_contiguous() && a.scalar_type() == b.scalar_type() &&
                    (a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16),
                "cuda_gemm_algo_ms: A and B must be contiguous CUDA [batch, rows, cols] tensors, both float16 or "
                "both bfloat16");
    c10::cuda::CUDAGuard guard(a.device());
    ns::cuda::GemmDesc g;
    g.dtype = a.scalar_type() == at::kHalf ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
    g.transpose_b = transpose_b;
    g.batch = a.size(0), g.m = a.size(1), g.k = a.size(2);
    g.n = transpose_b ? b.size(1) : b.size(2);
    DMUON_CHECK(b.size(0) == g.batch && (transpose_b ? b.size(2) : b.size(1)) == g.k, "cuda_gemm_algo_ms: B must be [",
                g.batch, ", ", transpose_b ? "n, " : "", g.k, transpose_b ? "" : ", n", "] for A of shape ", a.sizes());
    const bool has_c = c.has_value() && beta != 0.0;
    DMUON_CHECK(!has_c || (c->is_contiguous() && c->scalar_type() == a.scalar_type() &&
                           c->sizes() == at::IntArrayRef({g.batch, g.m, g.n})),
                "cuda_gemm_algo_ms: C must be a contiguous [batch, m, n] tensor of A's dtype");
    g.lda = g.k, g.stride_a = g.m * g.k;
    g.ldb = transpose_b ? g.k : g.n, g.stride_b = g.n * g.k;
    g.ldc = g.ldd = g.n, g.stride_c = g.stride_d = g.m * g.n;
    at::Tensor d = at::empty({g.batch, g.m, g.n}, a.options());
    constexpr size_t kWorkspaceBytes = ns::cuda::kCublasWorkspaceBytes;  // NOTE: as the backend's
    at::Tensor workspace = at::empty({static_cast<int64_t>(kWorkspaceBytes)}, a.options().dtype(at::kByte));
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const void* c_ptr = has_c ? c->data_ptr() : nullptr;
    std::vector<std::function<void()>> runs;
    for (int algo = 0; algo < ns::cuda::gemm_num_algos(g, has_c, kWorkspaceBytes); ++algo) {
      runs.push_back([=, &g, &a, &b, &d, &workspace] {
        ns::cuda::gemm(g, 1.0, a.data_ptr(), b.data_ptr(), has_c ? beta : 0.0, c_ptr, d.data_ptr(),
                       workspace.data_ptr(), kWorkspaceBytes, stream, algo);
      });
    }
    std::vector<std::string> errors;
    return ns::cuda::time_in_turns(runs, stream, &errors);
  });
}

}  // namespace
}  // namespace dmuon::torch_adapter

TORCH_LIBRARY_FRAGMENT(dmuon_testing, m) {
  m.def("cuda_sym_product(Tensor a, Tensor b, Tensor? c, float alpha, float beta, bool use_kernel) -> Tensor");
  m.def(
      "cuda_sym_product_config(Tensor a, Tensor b, Tensor? c, float alpha, float beta, str config, bool poison=True) "
      "-> Tensor");
  m.def("cuda_sym_configs() -> str[]", &dmuon::torch_adapter::sym_configs_op);
  m.def("cuda_sym_portable_configs(int m) -> str[]", &dmuon::torch_adapter::sym_portable_configs_op);
  m.def("cuda_sym_kernel_usable(Tensor x, str dtype) -> bool");
  m.def("cuda_autotune_measurements(Tensor like) -> int");
  m.def("cuda_gemm_algo_ms(Tensor a, Tensor b, Tensor? c, float beta, bool transpose_b) -> float[]");
}

TORCH_LIBRARY_IMPL(dmuon_testing, CUDA, m) {
  m.impl("cuda_sym_product", &dmuon::torch_adapter::sym_product_op);
  m.impl("cuda_sym_product_config", &dmuon::torch_adapter::sym_product_config_op);
  m.impl("cuda_sym_kernel_usable", &dmuon::torch_adapter::sym_kernel_usable_op);
  m.impl("cuda_autotune_measurements", &dmuon::torch_adapter::autotune_measurements_op);
  m.impl("cuda_gemm_algo_ms", &dmuon::torch_adapter::gemm_algo_ms_op);
}
