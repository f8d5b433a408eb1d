// dmuon/ns/ns_bound.cpp — the FLOP and byte floors of ns_bound.h.
#include "ns/ns_bound.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "common/check.h"
#include "ns/ns_algorithms.h"

namespace dmuon::ns {

bool ProductShape::operator==(const ProductShape& other) const {
  return std::tie(kind, batch, m, n, k, with_c, same_operands) ==
         std::tie(other.kind, other.batch, other.m, other.n, other.k, other.with_c, other.same_operands);
}

bool ProductShape::operator<(const ProductShape& other) const {
  return std::tie(kind, batch, m, n, k, with_c, same_operands) <
         std::tie(other.kind, other.batch, other.m, other.n, other.k, other.with_c, other.same_operands);
}

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
    kernels.push_back({flops, reads({&a, &b, beta != 0.0 ? c : nullptr}) + bytes_of(d), KernelKind::kSymmetric,
                       {KernelKind::kSymmetric, d.batch, d.rows, d.cols, a.cols, beta != 0.0, a.data == b.data}});
  }
  void gemm(double, BatchedMatrix<Elem> a, BatchedMatrix<Elem> b, double beta, const BatchedMatrix<Elem>* c,
            BatchedMatrix<Elem> d) {
    const double flops = 2.0 * static_cast<double>(d.batch) * d.rows * d.cols * a.cols;
    kernels.push_back({flops, reads({&a, &b, beta != 0.0 ? c : nullptr}) + bytes_of(d), KernelKind::kDense,
                       {KernelKind::kDense, d.batch, d.rows, d.cols, a.cols, beta != 0.0, a.data == b.data}});
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

namespace {

// The iterations the CUDA backend may run for `schedule` on one rows×cols matrix
// (cuda_backend.cu): square Gram schedules run standard; wide ones either, as timed.
std::vector<Algorithm> iterations_of(const Schedule& schedule, int64_t rows, int64_t cols) {
  std::vector<Algorithm> candidates{Algorithm::kStandard};
  if (schedule.algorithm == Algorithm::kGram && rows != cols) candidates.push_back(Algorithm::kGram);
  return candidates;
}

// Adds one batch to `out`: the cheaper of its iterations, each kernel taking
// `seconds_of(kernel)` for the whole batch (the kernels are listed per matrix).
template <typename SecondsOf>
void add_batch(StepBound& out, const Schedule& schedule, const NsBatch& batch, SecondsOf&& seconds_of) {
  DMUON_CHECK(batch.count >= 1, "a batch's count must be >= 1, got ", batch.count);
  double best = 0.0;
  std::vector<KernelWork> chosen;
  const std::vector<Algorithm> candidates = iterations_of(schedule, batch.rows, batch.cols);
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::vector<KernelWork> kernels = ns_kernel_work(schedule, candidates[i], batch.rows, batch.cols);
    double seconds = 0.0;
    for (const KernelWork& k : kernels) seconds += seconds_of(k);
    if (i > 0 && seconds >= best) continue;
    best = seconds;
    chosen = std::move(kernels);
  }
  const double count = static_cast<double>(batch.count);
  out.ns_seconds += best;
  for (const KernelWork& k : chosen) {
    out.ns_flops += count * k.flops;
    out.ns_bytes += count * k.bytes;
    part_seconds(out, k.kind) += seconds_of(k);
  }
  out.pass_bytes += count * kFusedStepPassBytesPerParam * static_cast<double>(batch.rows) *
                    static_cast<double>(batch.cols);
}

}  // namespace

StepBound fused_step_bound(const std::vector<std::pair<int64_t, int64_t>>& shapes, const Schedule& schedule,
                           double flops_per_second, double bytes_per_second) {
  DMUON_CHECK(flops_per_second > 0.0, "fused_step_bound: flops_per_second must be > 0, got ", flops_per_second);
  DMUON_CHECK(bytes_per_second > 0.0, "fused_step_bound: bytes_per_second must be > 0, got ", bytes_per_second);
  StepBound out;
  for (const auto& [rows, cols] : shapes) {
    add_batch(out, schedule, NsBatch{1, rows, cols}, [&](const KernelWork& k) {
      return kernel_bound_seconds(k, flops_per_second, bytes_per_second);
    });
  }
  out.passes_seconds = out.pass_bytes / bytes_per_second;
  return out;
}

std::vector<ProductShape> step_products(const std::vector<NsBatch>& batches, const Schedule& schedule) {
  std::vector<ProductShape> products;
  for (const NsBatch& batch : batches) {
    DMUON_CHECK(batch.count >= 1, "step_products: a batch's count must be >= 1, got ", batch.count);
    for (Algorithm algorithm : iterations_of(schedule, batch.rows, batch.cols)) {
      for (const KernelWork& k : ns_kernel_work(schedule, algorithm, batch.rows, batch.cols)) {
        if (k.kind == KernelKind::kElementwise) continue;
        ProductShape p = k.product;
        p.batch = batch.count;
        products.push_back(p);
      }
    }
  }
  std::sort(products.begin(), products.end());
  products.erase(std::unique(products.begin(), products.end()), products.end());
  return products;
}

StepBound measured_step_bound(const std::vector<NsBatch>& batches, const Schedule& schedule,
                              const std::vector<double>& dense_seconds, double bytes_per_second) {
  DMUON_CHECK(bytes_per_second > 0.0, "measured_step_bound: bytes_per_second must be > 0, got ", bytes_per_second);
  const std::vector<ProductShape> products = step_products(batches, schedule);
  DMUON_CHECK(dense_seconds.size() == products.size(), "measured_step_bound: dense_seconds has ",
              dense_seconds.size(), " times for the step's ", products.size(), " distinct products");
  for (size_t i = 0; i < dense_seconds.size(); ++i)
    DMUON_CHECK(dense_seconds[i] > 0.0 && std::isfinite(dense_seconds[i]), "measured_step_bound: dense_seconds[", i,
                "] must be a positive time, got ", dense_seconds[i]);
  StepBound out;
  for (const NsBatch& batch : batches) {
    const double count = static_cast<double>(batch.count);
    add_batch(out, schedule, batch, [&](const KernelWork& k) {
      const double bytes_s = count * k.bytes / bytes_per_second;
      if (k.kind == KernelKind::kElementwise) return bytes_s;
      ProductShape p = k.product;
      p.batch = batch.count;
      const auto it = std::lower_bound(products.begin(), products.end(), p);
      DMUON_CHECK(it != products.end() && *it == p, "internal: a product missing from step_products");
      const double dense = dense_seconds[static_cast<size_t>(it - products.begin())];
      return std::max(k.kind == KernelKind::kSymmetric ? 0.5 * dense : dense, bytes_s);
    });
  }
  out.passes_seconds = out.pass_bytes / bytes_per_second;
  return out;
}

}  // namespace dmuon::ns
