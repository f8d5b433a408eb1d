// dmuon/ns/schedule.cpp — coefficient schedules and their validation.
#include "ns/schedule.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace dmuon::ns {
namespace {

// Polar Express, 5 steps, unscaled (Amsel et al. 2025, as listed in DESIGN.md §3).
constexpr Coefficients kPolarExpress[] = {
    {8.28721, -23.59589, 17.30039}, {4.10706, -2.94785, 0.54484},
    {3.94869, -2.90890, 0.55182},   {3.31842, -2.48849, 0.51005},
    {2.30065, -1.66890, 0.41881},
};
constexpr int kNumPolarExpress = sizeof(kPolarExpress) / sizeof(kPolarExpress[0]);

// NOTE: 100 iterations is already far past any useful schedule; bounding it keeps a
// typo (ns_steps=5000) from silently burning minutes per step.
constexpr int kMaxSteps = 100;

}  // namespace

bool Schedule::operator==(const Schedule& o) const {
  bool same = algorithm == o.algorithm && steps.size() == o.steps.size() && restart_after == o.restart_after && eps == o.eps;
  for (size_t k = 0; same && k < steps.size(); ++k)
    same = steps[k].a == o.steps[k].a && steps[k].b == o.steps[k].b && steps[k].c == o.steps[k].c;
  return same;
}

void Schedule::validate() const {
  DMUON_CHECK(!steps.empty(), "ns_steps must be at least 1 (got an empty coefficient schedule)");
  DMUON_CHECK(static_cast<int>(steps.size()) <= kMaxSteps, "ns_steps must be at most ", kMaxSteps,
              ", got ", steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const Coefficients& c = steps[i];
    DMUON_CHECK(std::isfinite(c.a) && std::isfinite(c.b) && std::isfinite(c.c),
                "ns_coefficients[", i, "] = (", c.a, ", ", c.b, ", ", c.c, ") is not finite");
  }
  DMUON_CHECK(std::isfinite(eps) && eps > 0.0, "eps must be a positive finite number, got ", eps);
  for (int after : restart_after) {
    DMUON_CHECK(algorithm == Algorithm::kGram,
                "restarts are only defined for ns_algorithm='gram'");
    DMUON_CHECK(after >= 1 && after <= static_cast<int>(steps.size()),
                "restart iteration ", after, " is outside 1..", steps.size());
  }
  DMUON_CHECK(std::is_sorted(restart_after.begin(), restart_after.end()) &&
                  std::adjacent_find(restart_after.begin(), restart_after.end()) ==
                      restart_after.end(),
              "restart iterations must be strictly increasing");
}

Algorithm parse_algorithm(const std::string& name) {
  if (name == "gram") return Algorithm::kGram;
  if (name == "standard") return Algorithm::kStandard;
  DMUON_FAIL("ns_algorithm must be 'gram' or 'standard', got '", name, "'");
}

const char* algorithm_name(Algorithm algorithm) {
  return algorithm == Algorithm::kGram ? "gram" : "standard";
}

std::vector<Coefficients> keller_jordan_coefficients(int num_steps) {
  DMUON_CHECK(num_steps >= 1, "ns_steps must be at least 1, got ", num_steps);
  return std::vector<Coefficients>(static_cast<size_t>(num_steps), {3.4445, -4.7750, 2.0315});
}

std::vector<Coefficients> polar_express_coefficients(int num_steps, double safety) {
  DMUON_CHECK(num_steps >= 1, "ns_steps must be at least 1, got ", num_steps);
  DMUON_CHECK(safety >= 1.0, "the Polar Express safety factor must be >= 1, got ", safety);
  std::vector<Coefficients> steps;
  steps.reserve(static_cast<size_t>(num_steps));
  for (int i = 0; i < num_steps; ++i) {
    const Coefficients& c = kPolarExpress[std::min(i, kNumPolarExpress - 1)];
    steps.push_back({c.a / safety, c.b / std::pow(safety, 3), c.c / std::pow(safety, 5)});
  }
  return steps;
}

Schedule default_schedule(Algorithm algorithm, int num_steps, double eps) {
  Schedule schedule;
  schedule.algorithm = algorithm;
  schedule.eps = eps;
  if (algorithm == Algorithm::kGram) {
    schedule.steps = polar_express_coefficients(num_steps);
    // NOTE: one restart after iteration 2 (DESIGN.md §3): the Gram matrix accumulated in
    // half precision drifts (small negative eigenvalues grow); rebuilding it from X fixes it.
    if (num_steps > 2) schedule.restart_after = {2};
  } else {
    schedule.steps = keller_jordan_coefficients(num_steps);
  }
  return schedule;
}

double apply_to_singular_value(const Schedule& schedule, double sigma) {
  double x = sigma;
  for (const Coefficients& c : schedule.steps) {
    const double x2 = x * x;
    x = x * (c.a + x2 * (c.b + c.c * x2));
  }
  return x;
}

}  // namespace dmuon::ns
