// dmuon/ns/cpu/cpu_backend.cpp — the CPU backend of ns_algorithms.h and its entry point.
#include "ns/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/check.h"
#include "ns/cpu/cpu_gemm.h"
#include "ns/ns_algorithms.h"

namespace dmuon::ns {
namespace {

// Backend primitives over a batch, one matrix at a time (the entry point hands it
// batches of one so that parallelism lives in ParallelFor).
template <typename T>
struct CpuBackend {
  void sym_product(double alpha, BatchedMatrix<T> a, BatchedMatrix<T> b, double beta,
                   const BatchedMatrix<T>* c, BatchedMatrix<T> d) {
    for (int64_t i = 0; i < d.batch; ++i) {
      cpu::gemm<T>(/*transpose_b=*/true, d.rows, d.cols, a.cols, static_cast<T>(alpha),
                   a.matrix(i), a.ld, b.matrix(i), b.ld, static_cast<T>(beta),
                   c == nullptr ? nullptr : c->matrix(i), c == nullptr ? 0 : c->ld, d.matrix(i),
                   d.ld, /*lower_only=*/true);
    }
  }

  void gemm(double alpha, BatchedMatrix<T> a, BatchedMatrix<T> b, double beta,
            const BatchedMatrix<T>* c, BatchedMatrix<T> d) {
    for (int64_t i = 0; i < d.batch; ++i) {
      cpu::gemm<T>(/*transpose_b=*/false, d.rows, d.cols, a.cols, static_cast<T>(alpha),
                   a.matrix(i), a.ld, b.matrix(i), b.ld, static_cast<T>(beta),
                   c == nullptr ? nullptr : c->matrix(i), c == nullptr ? 0 : c->ld, d.matrix(i),
                   d.ld, /*lower_only=*/false);
    }
  }

  void add_identity(BatchedMatrix<T> z, double a, BatchedMatrix<T> q) {
    for (int64_t bi = 0; bi < z.batch; ++bi) {
      for (int64_t i = 0; i < z.rows; ++i) {
        for (int64_t j = 0; j < z.cols; ++j) {
          q.matrix(bi)[i * q.ld + j] =
              z.matrix(bi)[i * z.ld + j] + (i == j ? static_cast<T>(a) : T(0));
        }
      }
    }
  }
};

// Orthogonalize one matrix: normalize into a wide iterate, run the schedule, write back.
template <typename T>
void orthogonalize_one(const Schedule& schedule, T* matrix, int64_t rows, int64_t cols,
                       double norm) {
  const bool transposed = rows > cols;
  const int64_t m = transposed ? cols : rows;
  const int64_t n = transposed ? rows : cols;

  const T scale = static_cast<T>(1.0 / std::max(norm, schedule.eps));

  // Workspace: 2 iterates of m×n and up to 5 m×m matrices.
  const int64_t mn = m * n;
  const int64_t mm = m * m;
  std::vector<T> buffer(static_cast<size_t>(2 * mn + 5 * mm));
  T* x = buffer.data();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      x[transposed ? j * n + i : i * n + j] = matrix[i * cols + j] * scale;

  CpuBackend<T> backend;
  auto view = [](T* p, int64_t r, int64_t c) { return packed_batch<T>(p, 1, r, c); };
  BatchedMatrix<T> result;
  if (schedule.algorithm == Algorithm::kStandard) {
    StandardWorkspace<T> ws{view(x + mn, m, n), view(x + 2 * mn, m, m),
                            view(x + 2 * mn + mm, m, m)};
    result = run_standard_ns(backend, schedule, view(x, m, n), ws);
  } else {
    GramWorkspace<T> ws{view(x + mn, m, n),          view(x + 2 * mn, m, m),
                        view(x + 2 * mn + mm, m, m), view(x + 2 * mn + 2 * mm, m, m),
                        view(x + 2 * mn + 3 * mm, m, m), view(x + 2 * mn + 4 * mm, m, m)};
    result = run_gram_ns(backend, schedule, view(x, m, n), ws);
  }

  const T* out = result.data;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      matrix[i * cols + j] = out[transposed ? j * n + i : i * n + j];
}

}  // namespace

void serial_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  if (n > 0) body(0, n);
}

template <typename T>
void orthogonalize_cpu(const Schedule& schedule, T* data, int64_t batch, int64_t rows,
                       int64_t cols, const ParallelFor& parallel_for) {
  schedule.validate();
  DMUON_CHECK(batch >= 0 && rows >= 1 && cols >= 1, "orthogonalize: invalid shape [", batch,
              ", ", rows, ", ", cols, "]");
  DMUON_CHECK(data != nullptr || batch == 0, "orthogonalize: null data");
  const int64_t stride = rows * cols;

  // Frobenius norms first (accumulated in double), so that a non-finite input is
  // reported before any matrix of the batch is overwritten.
  std::vector<double> norms(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const T* matrix = data + b * stride;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < stride; ++i) sum_sq += static_cast<double>(matrix[i]) * matrix[i];
    norms[static_cast<size_t>(b)] = std::sqrt(sum_sq);
    DMUON_CHECK(std::isfinite(norms[static_cast<size_t>(b)]), "Newton-Schulz input ", b,
                " of the batch contains a non-finite value");
  }

  parallel_for(batch, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      orthogonalize_one(schedule, data + b * stride, rows, cols, norms[static_cast<size_t>(b)]);
  });
}

template void orthogonalize_cpu<float>(const Schedule&, float*, int64_t, int64_t, int64_t,
                                       const ParallelFor&);
template void orthogonalize_cpu<double>(const Schedule&, double*, int64_t, int64_t, int64_t,
                                        const ParallelFor&);

}  // namespace dmuon::ns
