// dmuon/ns/schedule.h — what one Newton–Schulz run computes: algorithm, per-step
// quintic coefficients, Gram restarts and the normalization epsilon.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dmuon::ns {

/// Which iteration computes the polynomial.
enum class Algorithm {
  kStandard,  ///< X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ (Keller Jordan's Muon).
  kGram,      ///< the same polynomial accumulated in the m×m Gram space (Dao-AILab, 2026).
};

/// One step's odd quintic p(x) = a·x + b·x³ + c·x⁵.
struct Coefficients {
  double a = 0.0;
  double b = 0.0;
  double c = 0.0;
};

/// A full Newton–Schulz run: one Coefficients per iteration.
struct Schedule {
  Algorithm algorithm = Algorithm::kGram;
  std::vector<Coefficients> steps;
  /// Gram only: restart (X ← Q·X, R ← X·Xᵀ, Q ← I) after these 1-based iterations.
  std::vector<int> restart_after;
  /// X is divided by max(‖X‖_F, eps) before iterating.
  double eps = 1e-7;

  /// Throws dmuon::Error naming the offending field when the schedule is unusable.
  void validate() const;
  bool operator==(const Schedule& o) const;
};

/// Parse "gram" / "standard"; throws naming the argument `ns_algorithm` otherwise.
Algorithm parse_algorithm(const std::string& name);
const char* algorithm_name(Algorithm algorithm);

/// Keller Jordan's fixed quintic (3.4445, −4.7750, 2.0315), repeated `num_steps` times.
std::vector<Coefficients> keller_jordan_coefficients(int num_steps);

/// Polar Express coefficients (Amsel et al., 2025) with each step's p(x) replaced by
/// p(x/s): (a/s, b/s³, c/s⁵). The first min(num_steps, 5) published steps are used;
/// further steps repeat the last one (the published schedule's converging polynomial).
std::vector<Coefficients> polar_express_coefficients(int num_steps, double safety = 1.05);

/// The default schedule of an algorithm: Gram → Polar Express with restart after
/// iteration 2; standard → Keller Jordan, no restarts.
Schedule default_schedule(Algorithm algorithm, int num_steps, double eps);

/// The scalar map the whole run applies to each normalized singular value (exact
/// arithmetic): composition of every step's polynomial. Used as the test oracle.
double apply_to_singular_value(const Schedule& schedule, double sigma);

}  // namespace dmuon::ns
