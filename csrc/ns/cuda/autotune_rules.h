// dmuon/ns/cuda/autotune_rules.h — the autotuner's decisions (autotune.h) as plain functions
// without CUDA: which candidates a product has, whether one passes its check, which wins,
// what runs untuned, and when a cached winner may run again. Part of the core in every
// build, so that machines without a GPU test them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ns/cuda/sm90_sym_config.h"
#include "ns/cuda/sym_product_args.h"
#include "ns/cuda/tri_plan.h"

namespace dmuon::ns::cuda {

/// Agreement of a 16-bit result d with a reference r (compare_16bit, elementwise.h).
struct CompareStats {
  float max_abs_diff = 0.f;  ///< over the finite elements of d
  float max_abs_ref = 0.f;
  double sum_sq_diff = 0.0;  ///< Σ (d − r)² over the finite elements
  double sum_sq_ref = 0.0;   ///< Σ r²
  unsigned nonfinite = 0;    ///< elements of d that are NaN or ±Inf
  unsigned asymmetric = 0;   ///< d[i][j] != d[j][i] (bitwise), when checked
};

/// The check's tolerance: a candidate passes when max |d − r| ≤ tolerance · max |r|.
double check_tolerance(DType dtype);

/// Empty when a candidate's result passes its check (every element finite, within
/// check_tolerance of the reference, and, when `symmetric`, bitwise symmetric); else why not.
std::string check_rejects(const CompareStats& stats, DType dtype, bool symmetric);

/// The cuBLASLt algorithm index that a configuration name "lt:<i>" stands for; −1 otherwise.
int parse_lt(const std::string& config);

/// The paths a mode lets a symmetric product take (sym_product_args.h).
struct SymPaths {
  bool kernel = false, blocks = false, panels = false, dense = false;
};
SymPaths sym_paths(SymMode mode);

/// The suffix of a mode in tune-cache keys ("" for kKernel, whose keys predate the others).
const char* sym_mode_tag(SymMode mode);

/// One line naming a mode's paths (the step's log of the path chosen for a GPU).
const char* sym_mode_description(SymMode mode);

/// The mode of a GPU's symmetric products. `forced`: DMUON_SYM_PATH's value ("" or "auto": the
/// kernel where `kernel_usable` and `sym_kernel`, dense only where not `sym_kernel`, else the
/// portable products or dense; "sm90", "portable" (blocks or panels), "blocks", "panels",
/// "dense": that path alone). Throws, naming DMUON_SYM_PATH, on any other value and on "sm90"
/// where the kernel is not usable.
SymMode choose_sym_mode(const std::string& forced, bool kernel_usable, bool sym_kernel);

/// What a symmetric product of m×m results runs untuned: the kernel's default configuration
/// where the mode allows the kernel; the row panels' default block where the mode allows them
/// and m ≥ kPortableDefaultMinM (always when forced); the lower blocks' default block where
/// they alone are allowed; else cuBLASLt's first algorithm.
std::string sym_default_config(SymMode mode, int64_t m);

/// Below this m an untuned product takes the dense path rather than the portable one.
/// NOTE: not measured yet: below it a product of the NS step takes tens of microseconds, where
/// the portable product's extra launches (one GEMM per panel, then the mirror) may cost what
/// its saved FLOPs gain; the tuner measures both wherever it runs.
inline constexpr int64_t kPortableDefaultMinM = 1024;

/// Whether a call may tune now: the tuner is on (DMUON_AUTOTUNE) and the stream is not
/// capturing a CUDA graph (tuning synchronizes); otherwise the default runs.
bool may_tune(bool enabled, bool capturing);

/// The candidates of a symmetric product, in the order they are tried, each where the mode
/// allows its path: (with the kernel built) every one of `configs` that can run `args` on
/// `num_sms` SMs; the lower blocks with each block of blk_block_candidates(args.m); the row
/// panels with each block of tri_block_candidates(args.m); (when a forced portable path has no
/// candidate) its default block alone; cuBLASLt's algorithms "lt:0" … "lt:<num_lt_algos − 1>".
std::vector<std::string> sym_candidates(const SymProductArgs& args, SymMode mode, bool kernel_built,
                                        const std::vector<Sm90SymConfig>& configs, int num_lt_algos, int num_sms);

/// Whether a cached winner of a symmetric product may run `args` now, in a mode that allows
/// its path: "lt:<i>" while the heuristic still offers algorithm i; "blk:<block>" and
/// "tri:<block>" always; a
/// kernel configuration when it can run `args` and is one of `configs` (the candidates now: a
/// winner cached by a build with DMUON_EXPERIMENTAL_KERNELS=ON does not run in one without).
/// Otherwise the key is tuned again.
bool cached_sym_winner_applies(const std::string& config, const SymProductArgs& args, SymMode mode,
                               int num_lt_algos, const std::vector<Sm90SymConfig>& configs, int num_sms);

/// Whether a cached winner of a dense product ("lt:<i>") may run now: i < num_algos.
bool cached_gemm_winner_applies(const std::string& config, int num_algos);

/// What an uncached dense product does.
enum class GemmTuning {
  kDefault,     ///< run algorithm 0, record nothing (tuning is off or the stream captures)
  kRecordOnly,  ///< the heuristic offers one algorithm: run and record it, no measurement
  kSearch,      ///< check and time every algorithm
};
GemmTuning gemm_tuning(bool enabled, bool capturing, int num_algos);

/// The winner among candidates timed in turns: the index of the smallest time that is not
/// NaN (NaN: the candidate's run failed), the first of equal times; nullopt when none is.
std::optional<size_t> fastest(const std::vector<double>& times_ms);

}  // namespace dmuon::ns::cuda
