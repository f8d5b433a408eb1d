// dmuon/torch/cuda/cuda_orthogonalize.cpp — the CUDA backend on torch tensors.
#include "cuda_orthogonalize.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/check.h"
#include "ns/cuda/cuda_backend.h"

namespace dmuon::torch_adapter {
namespace {

ns::cuda::DType to_dtype(at::ScalarType t) {
  DMUON_CHECK(t == at::kHalf || t == at::kBFloat16,
              "the CUDA backend iterates in float16 or bfloat16, not ", t);
  return t == at::kHalf ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
}

// A [B, rows, cols] view with row stride padded to 8 elements (TMA alignment).
at::Tensor padded(const at::Tensor& t) {
  const int64_t ld = ns::cuda::padded_ld(t.size(2));
  at::Tensor storage = at::zeros({t.size(0), t.size(1), ld}, t.options());
  at::Tensor view = storage.narrow(2, 0, t.size(2));
  view.copy_(t);
  return view;
}

ns::cuda::SymProductArgs sym_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                  const at::Tensor& d, double alpha, double beta) {
  ns::cuda::SymProductArgs args;
  args.dtype = to_dtype(a.scalar_type());
  args.batch = a.size(0), args.m = a.size(1), args.k = a.size(2);
  args.a = a.data_ptr(), args.lda = a.stride(1), args.stride_a = a.stride(0);
  args.b = b.data_ptr(), args.ldb = b.stride(1), args.stride_b = b.stride(0);
  if (c.defined()) args.c = c.data_ptr(), args.ldc = c.stride(1), args.stride_c = c.stride(0);
  args.d = d.data_ptr(), args.ldd = d.stride(1), args.stride_d = d.stride(0);
  args.alpha = alpha;
  args.beta = c.defined() ? beta : 0.0;
  return args;
}

// The kernel against the dense, mirrored cuBLASLt product on an odd-sized batch:
// every element close (fp32 accumulation, one rounding each) and the result exactly symmetric.
bool self_check(const at::Tensor& like, at::ScalarType dtype) {
  const int64_t batch = 3, m = 203, k = 333;
  // NOTE: inputs come from a private CPU generator so that the check leaves the user's
  // random streams (CPU and CUDA) untouched.
  at::Generator gen = at::detail::createCPUGenerator(/*seed_in=*/20261129);
  auto random = [&](at::IntArrayRef sizes, double scale) {
    return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat)).mul_(scale).to(like.device());
  };
  at::Tensor a = padded(random({batch, m, k}, 1.0 / std::sqrt(double(k))).to(dtype));
  at::Tensor b = padded(random({batch, m, k}, 1.0 / std::sqrt(double(k))).to(dtype));
  at::Tensor c0 = random({batch, m, m}, 1.0);
  at::Tensor c = padded((c0 + c0.transpose(1, 2)).to(dtype));
  at::Tensor kernel = cuda_sym_product(a, b, c, 0.75, -0.5, /*use_kernel=*/true).to(at::kFloat);
  at::Tensor dense = cuda_sym_product(a, b, c, 0.75, -0.5, /*use_kernel=*/false).to(at::kFloat);
  // The dense reference's lower triangle is the exact product; compare it there.
  at::Tensor lower = at::tril(at::ones({m, m}, like.options().dtype(at::kBool)));
  const double scale = dense.abs().max().item<double>();
  const double err = (kernel - dense).masked_select(lower).abs().max().item<double>();
  const bool symmetric = at::equal(kernel, kernel.transpose(1, 2));
  const double tol = (dtype == at::kHalf ? 4e-3 : 3e-2) * scale;
  if (!(err <= tol) || !symmetric) {
    TORCH_WARN("dmuon: the sm_90a symmetric kernel failed its self-check (", dtype, ": max error ",
               err, " vs tolerance ", tol, ", symmetric ", symmetric,
               "); falling back to the ATen backend");
    return false;
  }
  return true;
}

}  // namespace

bool cuda_sym_kernel_usable(const at::Tensor& x, at::ScalarType dtype) {
  if (!x.is_cuda() || (dtype != at::kHalf && dtype != at::kBFloat16)) return false;
  const int device = x.get_device();
  if (!ns::cuda::sym_kernel_supported(device)) return false;
  static std::mutex mutex;
  static std::map<std::pair<int, int>, bool> verdicts;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, static_cast<int>(dtype));
  auto it = verdicts.find(key);
  if (it != verdicts.end()) return it->second;
  bool ok = false;
  try {
    c10::cuda::CUDAGuard guard(x.device());
    ok = self_check(x, dtype);
  } catch (const std::exception& error) {
    TORCH_WARN("dmuon: the sm_90a symmetric kernel's self-check raised: ", error.what(),
               "; falling back to the ATen backend");
  }
  verdicts[key] = ok;
  return ok;
}

at::Tensor cuda_sym_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                            double alpha, double beta, bool use_kernel) {
  DMUON_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 3 && b.sizes() == a.sizes() &&
                  a.scalar_type() == b.scalar_type() && a.stride(2) == 1 && b.stride(2) == 1,
              "cuda_sym_product: A and B must be CUDA [B, m, k] tensors of one dtype with unit column stride");
  c10::cuda::CUDAGuard guard(a.device());
  const int64_t batch = a.size(0), m = a.size(1);
  at::Tensor d = at::empty({batch, m, ns::cuda::padded_ld(m)}, a.options()).narrow(2, 0, m);
  d.fill_(std::numeric_limits<double>::quiet_NaN());  // poisoned: every element must be written
  if (c.defined())
    DMUON_CHECK(c.sizes() == d.sizes() && c.scalar_type() == a.scalar_type() && c.stride(2) == 1,
                "cuda_sym_product: C must be [B, m, m] of A's dtype");
  ns::cuda::sym_product(sym_args(a, b, c, d, alpha, beta),
                        use_kernel ? ns::cuda::SymMode::kKernel : ns::cuda::SymMode::kDenseMirror,
                        at::cuda::getCurrentCUDAStream());
  return d;
}

at::Tensor orthogonalize_cuda(const at::Tensor& batch, const ns::Schedule& schedule,
                              at::ScalarType dtype, bool use_kernel) {
  DMUON_CHECK(batch.is_cuda() && batch.dim() == 3, "orthogonalize_cuda: expected a CUDA [B, m, n] tensor");
  c10::cuda::CUDAGuard guard(batch.device());
  const int64_t num = batch.size(0), rows = batch.size(1), cols = batch.size(2);
  at::Tensor input = batch.to(at::kFloat).contiguous();
  at::Tensor output = at::empty({num, rows, cols}, input.options());
  const size_t bytes = ns::cuda::workspace_bytes(schedule.algorithm, num, rows, cols);
  // NOTE: the caching allocator's blocks are 512-byte aligned, more than the 256 needed.
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, input.options().dtype(at::kByte));
  ns::cuda::orthogonalize(schedule, to_dtype(dtype),
                          use_kernel ? ns::cuda::SymMode::kKernel : ns::cuda::SymMode::kDenseMirror,
                          input.data_ptr<float>(), output.data_ptr<float>(), num, rows, cols,
                          workspace.data_ptr(), bytes, at::cuda::getCurrentCUDAStream());
  return output;
}

}  // namespace dmuon::torch_adapter

// Test-facing ops (registered only in CUDA builds): torch.ops.dmuon.cuda_sym_product and
// torch.ops.dmuon.cuda_sym_kernel_usable.
namespace {

at::Tensor cuda_sym_product_op(const at::Tensor& a, const at::Tensor& b,
                               const std::optional<at::Tensor>& c, double alpha, double beta,
                               bool use_kernel) {
  try {
    return dmuon::torch_adapter::cuda_sym_product(a, b, c.has_value() ? *c : at::Tensor(), alpha,
                                                  beta, use_kernel);
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

bool cuda_sym_kernel_usable_op(const at::Tensor& x, c10::string_view dtype) {
  TORCH_CHECK(dtype == "float16" || dtype == "bfloat16", "dtype must be float16 or bfloat16");
  return dmuon::torch_adapter::cuda_sym_kernel_usable(x, dtype == "float16" ? at::kHalf : at::kBFloat16);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dmuon, m) {
  m.def("cuda_sym_product(Tensor a, Tensor b, Tensor? c, float alpha, float beta, bool use_kernel) -> Tensor");
  m.def("cuda_sym_kernel_usable(Tensor x, str dtype) -> bool");
}

TORCH_LIBRARY_IMPL(dmuon, CUDA, m) {
  m.impl("cuda_sym_product", &cuda_sym_product_op);
  m.impl("cuda_sym_kernel_usable", &cuda_sym_kernel_usable_op);
}
