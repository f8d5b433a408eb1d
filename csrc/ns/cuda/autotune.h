// dmuon/ns/cuda/autotune.h — per-shape search of the CUDA NS backend's configurations
// (torch-free). Problem descriptor → candidate configs → checked, timed → winner cached.
//
// Candidates per key (op, m, n, k, batch, dtype):
//   "sym"  symmetric products, each path where the SymMode allows it: every built sm_90a
//          kernel config that applies ("sm90:<epilogue>:s<stages>:c0"), the portable
//          lower-block and row-panel products with each candidate block ("blk:<block>",
//          "tri:<block>", tri_plan.h) and cuBLASLt's dense product + mirror with each of the
//          heuristic's algorithms ("lt:<i>");
//   "gemm" dense products: cuBLASLt's algorithms ("lt:<i>");
//   "ns"   Gram vs standard iteration for a Gram schedule ("gram" / "standard").
// A candidate may win only after matching a dense reference (cuBLASLt's first algorithm,
// mirrored; for "ns", the Gram iteration whose products were all checked) and, for
// symmetric products, being exactly symmetric. Tuning runs on the call's own operands
// the first time a key is seen (never while a CUDA graph is being captured), so the
// call's result is the winner's. Results live in the on-disk TuneCache
// (csrc/autotune/tune_cache.h) and are reused by later processes.
// Knobs (csrc/common/env.h): DMUON_AUTOTUNE (default 1; 0: untuned defaults),
// DMUON_PRINT_CONFIGS (default 0; 1: print each chosen config once per key),
// DMUON_AUTOTUNE_CACHE (path; "none" keeps results in memory only).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autotune/tune_cache.h"
#include "ns/cuda/cublaslt_gemm.h"
#include "ns/cuda/cuda_backend.h"

namespace dmuon::ns::cuda {

/// "float16" / "bfloat16".
const char* dtype_name(DType dtype);

/// Median time in ms of each of `runs` on `stream` (CUDA events; each was already run once),
/// timed in turns over rounds (autotune/timing_rounds.h), so that every run sees the same
/// mix of clocks. A run that throws gets NaN and its error in (*errors)[i].
std::vector<double> time_in_turns(const std::vector<std::function<void()>>& runs, cudaStream_t stream,
                                  std::vector<std::string>* errors);

/// True while `stream` is capturing a CUDA graph (nothing may synchronize then).
bool stream_is_capturing(cudaStream_t stream);

/// The process-wide tuner: thread-safe; one TuneCache per GPU name.
class Autotuner {
 public:
  static Autotuner& instance();

  /// DMUON_AUTOTUNE (read once).
  bool enabled() const;

  /// D = α·A·Bᵀ + β·C (symmetric result) with the tuned configuration of its key; the
  /// first call of a key measures every candidate of the paths `mode` allows on these
  /// operands (sym_candidates, autotune_rules.h).
  void sym_product(const SymProductArgs& args, SymMode mode, void* lt_workspace,
                   size_t lt_workspace_bytes, cudaStream_t stream);

  /// Dense D = α·A·op(B) + β·C with the tuned cuBLASLt algorithm of its key.
  void gemm(const GemmDesc& desc, double alpha, const void* a, const void* b, double beta,
            const void* c, void* d, void* lt_workspace, size_t lt_workspace_bytes,
            cudaStream_t stream);

  /// The recorded entry of a key on the current device, if any.
  std::optional<autotune::TuneEntry> lookup(const autotune::TuneKey& key);

  /// Record a measured winner (memory and the on-disk cache) and print it once when
  /// DMUON_PRINT_CONFIGS is set. `how`: "tuned" or "cached" or "default".
  void record(const autotune::TuneKey& key, const autotune::TuneEntry& entry);

  /// Print a chosen config once per key (DMUON_PRINT_CONFIGS).
  void report(const autotune::TuneKey& key, const autotune::TuneEntry& entry, const char* how);

  /// Number of candidate measurements so far (tests: a second process must measure none).
  int64_t num_measurements() const;

  /// The on-disk store of this process (DMUON_AUTOTUNE_CACHE, resolved once; empty:
  /// memory only) and the environment the current device's entries are kept under: the
  /// step engine keeps its measured NS times there too (step/cost_profile.h).
  std::string cache_path();
  autotune::TuneEnvironment environment();

 private:
  Autotuner() = default;
  autotune::TuneCache& cache();  // of the current device's GPU
  std::string run_sym(const SymProductArgs& args, const std::string& config, void* lt_workspace,
                      size_t lt_workspace_bytes, cudaStream_t stream);
};

/// Run one symmetric product with a named configuration ("sm90:…", "blk:<block>", "tri:<block>" or
/// "lt:<i>"); throws
/// when it does not apply to args (tests and the tuner).
void sym_product_with(const SymProductArgs& args, const std::string& config, void* lt_workspace,
                      size_t lt_workspace_bytes, cudaStream_t stream);

}  // namespace dmuon::ns::cuda
