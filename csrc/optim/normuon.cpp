// dmuon/optim/normuon.cpp — NorMuon's row normalization (see normuon.h for the rule).
#include "optim/normuon.h"

#include <cmath>
#include <vector>

#include "common/check.h"

namespace dmuon::optim {

void NormuonRule::validate() const {
  DMUON_CHECK(std::isfinite(beta2) && beta2 >= 0.0 && beta2 < 1.0, "normuon_beta2 must be a number in [0, 1), got ",
              beta2);
  DMUON_CHECK(std::isfinite(eps) && eps > 0.0, "normuon_eps must be a finite number > 0, got ", eps);
}

template <typename T>
bool normuon_matrix(T* o, const MatrixRef& m, float* v, const NormuonRule& rule) {
  DMUON_CHECK(m.rows >= 1 && m.cols >= 1, "normuon_matrix: invalid matrix shape ", m.rows, "x", m.cols);
  // Row sums of O² and ‖O‖²_F, in double.
  std::vector<double> row_sq(static_cast<size_t>(m.rows), 0.0);
  double norm_sq = 0.0;
  for (int64_t i = 0; i < m.rows; ++i) {
    double s = 0.0;
    for (int64_t j = 0; j < m.cols; ++j) {
      const double x = static_cast<double>(o[m.at(i, j)]);
      s += x * x;
    }
    row_sq[static_cast<size_t>(i)] = s;
    norm_sq += s;
  }
  if (!std::isfinite(norm_sq)) return false;
  // The second moment (float32 state) and each row's divisor √v + ε.
  std::vector<double> inv(static_cast<size_t>(m.rows));
  double hat_sq = 0.0;
  for (int64_t i = 0; i < m.rows; ++i) {
    const double mean_sq = row_sq[static_cast<size_t>(i)] / static_cast<double>(m.cols);
    v[i] = static_cast<float>(rule.beta2 * static_cast<double>(v[i]) + (1.0 - rule.beta2) * mean_sq);
    const double d = std::sqrt(static_cast<double>(v[i])) + rule.eps;
    inv[static_cast<size_t>(i)] = 1.0 / d;
    hat_sq += row_sq[static_cast<size_t>(i)] / (d * d);
  }
  // NOTE: O = 0 has ‖Ô‖ = 0: nothing to rescale (the factor would be 0/0).
  if (hat_sq <= 0.0) return true;
  const double keep = std::sqrt(norm_sq / hat_sq);
  for (int64_t i = 0; i < m.rows; ++i) {
    const double f = inv[static_cast<size_t>(i)] * keep;
    for (int64_t j = 0; j < m.cols; ++j) {
      T& x = o[m.at(i, j)];
      x = static_cast<T>(static_cast<double>(x) * f);
    }
  }
  return true;
}

template bool normuon_matrix<float>(float*, const MatrixRef&, float*, const NormuonRule&);
template bool normuon_matrix<double>(double*, const MatrixRef&, float*, const NormuonRule&);

}  // namespace dmuon::optim
