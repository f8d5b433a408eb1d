// dmuon/optim/qk_clip.cpp — MuonClip's per-head factors and their rows (qk_clip.h).
#include "optim/qk_clip.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace dmuon::optim {

bool QkClipFactors::any() const {
  auto differs = [](double f) { return f != 1.0; };
  return std::any_of(q.begin(), q.end(), differs) || std::any_of(k.begin(), k.end(), differs);
}

QkClipFactors qk_clip_factors(const std::vector<double>& max_logits, int64_t num_kv_heads, double tau) {
  DMUON_CHECK(std::isfinite(tau) && tau > 0.0, "tau must be a finite number > 0, got ", tau);
  const int64_t num_heads = static_cast<int64_t>(max_logits.size());
  DMUON_CHECK(num_heads >= 1, "num_heads must be >= 1 (max_logits is empty)");
  DMUON_CHECK(num_kv_heads >= 1 && num_heads % num_kv_heads == 0, "num_kv_heads must divide num_heads = ",
              num_heads, ", got ", num_kv_heads);
  QkClipFactors out;
  out.q.assign(static_cast<size_t>(num_heads), 1.0);
  out.k.assign(static_cast<size_t>(num_kv_heads), 1.0);
  const bool shared = num_kv_heads < num_heads;
  for (int64_t h = 0; h < num_heads; ++h) {
    const double s = max_logits[static_cast<size_t>(h)];
    DMUON_CHECK(!std::isnan(s) && s != INFINITY, "max_logits of head ", h, " is ", s,
                " (not finite; −inf means no logit was recorded)");
    if (s <= tau) continue;
    const double gamma = tau / s;
    if (shared) {
      out.q[static_cast<size_t>(h)] = gamma;
    } else {
      out.q[static_cast<size_t>(h)] = std::sqrt(gamma);
      out.k[static_cast<size_t>(h)] = std::sqrt(gamma);
    }
  }
  return out;
}

std::vector<double> qk_clip_row_factors(const std::vector<double>& head_factors, int64_t head_dim, int64_t row_begin,
                                        int64_t row_count) {
  DMUON_CHECK(head_dim >= 1, "head_dim must be >= 1, got ", head_dim);
  const int64_t total = static_cast<int64_t>(head_factors.size()) * head_dim;
  DMUON_CHECK(row_begin >= 0 && row_count >= 0 && row_begin + row_count <= total, "rows [", row_begin, ", ",
              row_begin + row_count, ") of a projection with ", head_factors.size(), " heads of ", head_dim,
              " rows (", total, " rows)");
  std::vector<double> out(static_cast<size_t>(row_count));
  for (int64_t r = 0; r < row_count; ++r)
    out[static_cast<size_t>(r)] = head_factors[static_cast<size_t>((row_begin + r) / head_dim)];
  return out;
}

}  // namespace dmuon::optim
