// tests/cpp/spectral_fixtures.h — matrices with a known SVD, built in fp64, so that the
// exact output of any Newton–Schulz schedule (U·f(Σ)·Vᵀ) and the polar factor (U·Vᵀ)
// are known without an SVD routine.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace dmuon::testing {

/// Row-major dense fp64 matrix.
struct Dense {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> v;
  double& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * cols + j)]; }
  double at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * cols + j)]; }
};

/// rows×k matrix with orthonormal columns (Gaussian, then twice-applied Gram–Schmidt).
inline Dense random_orthonormal_columns(int64_t rows, int64_t k, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Dense q{rows, k, std::vector<double>(static_cast<size_t>(rows * k))};
  for (auto& x : q.v) x = normal(rng);
  for (int64_t j = 0; j < k; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t p = 0; p < j; ++p) {
        double dot = 0.0;
        for (int64_t i = 0; i < rows; ++i) dot += q.at(i, p) * q.at(i, j);
        for (int64_t i = 0; i < rows; ++i) q.at(i, j) -= dot * q.at(i, p);
      }
    }
    double norm = 0.0;
    for (int64_t i = 0; i < rows; ++i) norm += q.at(i, j) * q.at(i, j);
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < rows; ++i) q.at(i, j) /= norm;
  }
  return q;
}

/// A matrix U·diag(s)·Vᵀ with its factors kept.
struct KnownSvd {
  Dense u;                  // rows×k
  Dense v;                  // cols×k
  std::vector<double> s;    // k singular values
  int64_t rows = 0;
  int64_t cols = 0;

  /// U·diag(f(s_i))·Vᵀ.
  template <typename F>
  Dense reconstruct(F f) const {
    Dense out{rows, cols, std::vector<double>(static_cast<size_t>(rows * cols), 0.0)};
    for (size_t p = 0; p < s.size(); ++p) {
      const double fs = f(s[p]);
      if (fs == 0.0) continue;
      for (int64_t i = 0; i < rows; ++i) {
        const double ui = u.at(i, static_cast<int64_t>(p)) * fs;
        for (int64_t j = 0; j < cols; ++j) out.at(i, j) += ui * v.at(j, static_cast<int64_t>(p));
      }
    }
    return out;
  }
  Dense matrix() const {
    return reconstruct([](double x) { return x; });
  }
  double frobenius() const {
    double sum = 0.0;
    for (double x : s) sum += x * x;
    return std::sqrt(sum);
  }
};

/// rows×cols with singular values `s` (k = min(rows, cols) of them; zeros allowed).
inline KnownSvd make_known_svd(int64_t rows, int64_t cols, std::vector<double> s,
                               std::mt19937_64& rng) {
  const int64_t k = std::min(rows, cols);
  s.resize(static_cast<size_t>(k), 0.0);
  return KnownSvd{random_orthonormal_columns(rows, k, rng), random_orthonormal_columns(cols, k, rng),
                  std::move(s), rows, cols};
}

/// Relative Frobenius distance ‖a − b‖ / ‖b‖.
template <typename T>
double relative_error(const std::vector<T>& a, const Dense& b) {
  double diff = 0.0;
  double ref = 0.0;
  for (size_t i = 0; i < b.v.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b.v[i];
    diff += d * d;
    ref += b.v[i] * b.v[i];
  }
  return std::sqrt(diff / ref);
}

}  // namespace dmuon::testing
