// dmuon/ns/ns_bound.cpp — the FLOP and byte floors of ns_bound.h.
#include "ns/ns_bound.h"

#include <algorithm>
#include <array>

#include "common/check.h"
#include "ns/ns_algorithms.h"

namespace dmuon::ns {
namespace {

// A backend of ns_algorithms.h that launches nothing: it records each kernel's work.
// NOTE: buffers are told apart by address (distinct elements of `tags`, never read), so
// an operand that is also another operand (A·Aᵀ, R² + β·R) is read once.
struct CountingBackend {
  using Elem = unsigned char;
  int elem_bytes = 2;
  std::vector<KernelWork> kernels;

  double bytes_of(const BatchedMatrix<Elem>& x) const {
    return static_cast<double>(x.batch) * static_cast<double>(x.rows) * static_cast<double>(x.cols) * elem_bytes;
  }
  double reads(std::initializer_list<const BatchedMatrix<Elem>*> operands) const {
    std::vector<const Elem*> seen;
    double bytes = 0.0;
    for (const BatchedMatrix<Elem>* x : operands) {
      if (x == nullptr || std::find(seen.begin(), seen.end(), x->data) != seen.end()) continue;
      seen.push_back(x->data);
      bytes += bytes_of(*x);
    }
    return bytes;
  }

  void sym_product(double, BatchedMatrix<Elem> a, BatchedMatrix<Elem> b, double beta, const BatchedMatrix<Elem>* c,
                   BatchedMatrix<Elem> d) {
    const double flops = static_cast<double>(d.batch) * d.rows * d.rows * a.cols;
    kernels.push_back({flops, reads({&a, &b, beta != 0.0 ? c : nullptr}) + bytes_of(d), KernelKind::kSymmetric});
  }
  void gemm(double, BatchedMatrix<Elem> a, BatchedMatrix<Elem> b, double beta, const BatchedMatrix<Elem>* c,
            BatchedMatrix<Elem> d) {
    const double flops = 2.0 * static_cast<double>(d.batch) * d.rows * d.cols * a.cols;
    kernels.push_back({flops, reads({&a, &b, beta != 0.0 ? c : nullptr}) + bytes_of(d), KernelKind::kDense});
  }
  void add_identity(BatchedMatrix<Elem> z, double, BatchedMatrix<Elem> q) {
    kernels.push_back({0.0, bytes_of(z) + bytes_of(q), KernelKind::kElementwise});
  }
};

// The part of a StepBound's NS floor that kernels of `kind` take.
double& part_seconds(StepBound& bound, KernelKind kind) {
  switch (kind) {
    case KernelKind::kSymmetric: return bound.sym_seconds;
    case KernelKind::kDense: return bound.dense_seconds;
    case KernelKind::kElementwise: break;
  }
  return bound.elementwise_seconds;
}

}  // namespace

std::vector<KernelWork> ns_kernel_work(const Schedule& schedule, Algorithm algorithm, int64_t rows, int64_t cols,
                                       int elem_bytes) {
  schedule.validate();
  DMUON_CHECK(rows >= 1 && cols >= 1, "ns_kernel_work: rows and cols must be >= 1, got ", rows, "x", cols);
  DMUON_CHECK(elem_bytes >= 1, "ns_kernel_work: elem_bytes must be >= 1, got ", elem_bytes);
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  static std::array<unsigned char, 8> tags{};  // NOTE: addresses only
  auto buffer = [](int i, int64_t r, int64_t c) {
    return BatchedMatrix<unsigned char>{&tags[static_cast<size_t>(i)], 1, r, c, c, r * c};
  };
  CountingBackend backend;
  backend.elem_bytes = elem_bytes;
  if (algorithm == Algorithm::kStandard) {
    StandardWorkspace<unsigned char> ws{buffer(1, m, n), buffer(2, m, m), buffer(3, m, m)};
    run_standard_ns(backend, schedule, buffer(0, m, n), ws);
  } else {
    GramWorkspace<unsigned char> ws{buffer(1, m, n), buffer(2, m, m), buffer(3, m, m),
                                    buffer(4, m, m), buffer(5, m, m), buffer(6, m, m)};
    run_gram_ns(backend, schedule, buffer(0, m, n), ws);
  }
  return backend.kernels;
}

double kernel_bound_seconds(const KernelWork& kernel, double flops_per_second, double bytes_per_second) {
  DMUON_CHECK(flops_per_second > 0.0, "kernel_bound_seconds: flops_per_second must be > 0, got ", flops_per_second);
  DMUON_CHECK(bytes_per_second > 0.0, "kernel_bound_seconds: bytes_per_second must be > 0, got ", bytes_per_second);
  return std::max(kernel.flops / flops_per_second, kernel.bytes / bytes_per_second);
}

double kernels_bound_seconds(const std::vector<KernelWork>& kernels, double flops_per_second,
                             double bytes_per_second) {
  DMUON_CHECK(flops_per_second > 0.0, "kernels_bound_seconds: flops_per_second must be > 0, got ", flops_per_second);
  DMUON_CHECK(bytes_per_second > 0.0, "kernels_bound_seconds: bytes_per_second must be > 0, got ", bytes_per_second);
  double seconds = 0.0;
  for (const KernelWork& k : kernels) seconds += kernel_bound_seconds(k, flops_per_second, bytes_per_second);
  return seconds;
}

StepBound fused_step_bound(const std::vector<std::pair<int64_t, int64_t>>& shapes, const Schedule& schedule,
                           double flops_per_second, double bytes_per_second) {
  DMUON_CHECK(flops_per_second > 0.0, "fused_step_bound: flops_per_second must be > 0, got ", flops_per_second);
  DMUON_CHECK(bytes_per_second > 0.0, "fused_step_bound: bytes_per_second must be > 0, got ", bytes_per_second);
  StepBound out;
  for (const auto& [rows, cols] : shapes) {
    // The iterations the CUDA backend may run for this schedule and shape (cuda_backend.cu).
    std::vector<Algorithm> candidates{Algorithm::kStandard};
    if (schedule.algorithm == Algorithm::kGram && rows != cols) candidates.push_back(Algorithm::kGram);
    double best = 0.0;
    std::vector<KernelWork> chosen;
    for (size_t i = 0; i < candidates.size(); ++i) {
      std::vector<KernelWork> kernels = ns_kernel_work(schedule, candidates[i], rows, cols);
      const double seconds = kernels_bound_seconds(kernels, flops_per_second, bytes_per_second);
      if (i > 0 && seconds >= best) continue;
      best = seconds;
      chosen = std::move(kernels);
    }
    out.ns_seconds += best;
    for (const KernelWork& k : chosen) {
      out.ns_flops += k.flops;
      out.ns_bytes += k.bytes;
      part_seconds(out, k.kind) += kernel_bound_seconds(k, flops_per_second, bytes_per_second);
    }
    out.pass_bytes += kFusedStepPassBytesPerParam * static_cast<double>(rows) * static_cast<double>(cols);
  }
  out.passes_seconds = out.pass_bytes / bytes_per_second;
  return out;
}

}  // namespace dmuon::ns
