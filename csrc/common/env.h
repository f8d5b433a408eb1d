// dmuon/common/env.h — the DMUON_* environment knobs: one typed accessor, one list.
//
// NOTE: modelled on NCCL's NCCL_PARAM (one declaration per knob, typed, parsed with an
// error naming the variable), except that nothing is cached: every read looks at the
// environment again, so a variable changed between two runtimes is seen by the second
// (a process-wide cache made `dmuon bench ns --ungated` time the gated path twice).
// Callers read code-path overrides once, when a runtime is made, and keep the value in
// that runtime; caches and diagnostics are read where they are used.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace dmuon::env {

/// Integer value of `name`; `default_value` when unset or empty; throws dmuon::Error
/// naming the variable if its value is not an integer.
int64_t get_int(const char* name, int64_t default_value);

/// Boolean value: 1/0, true/false, yes/no, on/off (case-insensitive).
bool get_bool(const char* name, bool default_value);

/// Floating-point value.
double get_double(const char* name, double default_value);

/// String value (verbatim; the default when unset or empty).
std::string get_string(const char* name, const std::string& default_value);

/// Whether `name` is set to a non-empty value now.
bool is_set(const char* name);

/// What a knob is for (docs/configuration.md lists every knob with its kind).
enum class KnobKind {
  kCache,       ///< where and how much dmuon keeps between calls (tune cache, graph cache)
  kDiagnostic,  ///< prints, timing, test hooks, solver budgets of experiments
  kOverride,    ///< a code-path switch: overrides an unset Execution field at runtime creation
};
const char* kind_name(KnobKind kind);

/// One DMUON_* variable of type T (bool, int64_t, double or const char* for text).
template <class T>
struct Knob {
  using Value = std::conditional_t<std::is_same_v<T, const char*>, std::string, T>;
  const char* name;
  T fallback;
  KnobKind kind;

  /// The value now (the fallback when unset); read from the environment at every call.
  Value get() const;
  /// The value now, or nullopt when unset (an override applies only when set).
  std::optional<Value> get_if_set() const {
    if (!is_set(name)) return std::nullopt;
    return get();
  }
};

template <>
inline bool Knob<bool>::get() const { return get_bool(name, fallback); }
template <>
inline int64_t Knob<int64_t>::get() const { return get_int(name, fallback); }
template <>
inline double Knob<double>::get() const { return get_double(name, fallback); }
template <>
inline std::string Knob<const char*>::get() const { return get_string(name, fallback); }

// Every knob, once: (identifier, type, variable, fallback, kind, what it does).
#define DMUON_ENV_KNOBS(X)                                                                                          \
  X(kAutotune, bool, "DMUON_AUTOTUNE", true, kCache,                                                                \
    "autotune kernel configurations on first use and keep them in the tune cache (0: untuned defaults)")             \
  X(kAutotuneCache, const char*, "DMUON_AUTOTUNE_CACHE", "", kCache,                                                 \
    "path of the on-disk tune cache (none: memory only; default $XDG_CACHE_HOME/dmuon/autotune.txt)")               \
  X(kGraphCacheMb, int64_t, "DMUON_GRAPH_CACHE_MB", 8192, kCache,                                                    \
    "MiB of workspaces the CUDA-graph cache of Newton-Schulz keeps (one per stream)")                                \
  X(kPrintConfigs, bool, "DMUON_PRINT_CONFIGS", false, kDiagnostic,                                                  \
    "print each autotuned kernel configuration once per key")                                                      \
  X(kProfile, bool, "DMUON_PROFILE", false, kDiagnostic,                                                             \
    "synchronize the device between step phases so that their times are real (read at runtime creation)")           \
  X(kAutotuneTestBreak, const char*, "DMUON_AUTOTUNE_TEST_BREAK", "", kDiagnostic,                                   \
    "test hook: perturb every autotune candidate whose name starts with this prefix")                               \
  X(kTestExit, const char*, "DMUON_TEST_EXIT", "", kDiagnostic,                                                      \
    "test hook: PHASE@STEP ends the process (code 17) when engine step STEP reaches PHASE (exchange or ns)")         \
  X(kSymPath, const char*, "DMUON_SYM_PATH", "auto", kDiagnostic,                                                 \
    "force the symmetric-product path (auto, sm90, portable, blocks, panels, dense) of the CUDA ops made while it "  \
    "is set")                                                                                                       \
  X(kPlanTimeLimit, double, "DMUON_PLAN_TIME_LIMIT", 0.0, kDiagnostic,                                              \
    "seconds the MILP owner planner may search (unset, shown as 0: MilpOptions' 2 s)")                                     \
  X(kPlanMaxNodes, int64_t, "DMUON_PLAN_MAX_NODES", 0, kDiagnostic,                                                 \
    "branch-and-bound nodes per MILP stage (unset, shown as 0: MilpOptions' 20000)")                        \
  X(kFusedStreams, int64_t, "DMUON_FUSED_STREAMS", 2, kOverride,                                                    \
    "Execution.streams: CUDA streams of the gated fused step (1-8)")                                               \
  X(kPipelineDepth, int64_t, "DMUON_PIPELINE_DEPTH", 0, kOverride,                                                  \
    "Execution.pipeline_depth: buckets of pipeline slack (0: twice the world size)")                               \
  X(kNsBatchMb, int64_t, "DMUON_NS_BATCH_MB", 2048, kOverride,                                                      \
    "Execution.ns_batch_mb: MiB bound on one fused Newton-Schulz batch's workspace")                               \
  X(kCudaGraphs, bool, "DMUON_CUDA_GRAPHS", true, kOverride,                                                        \
    "Execution.cuda_graphs: capture and replay the Newton-Schulz iteration as CUDA graphs")

#define DMUON_DECLARE_KNOB(id, type, variable, fallback, kind, what) \
  inline constexpr Knob<type> id{variable, fallback, KnobKind::kind};
DMUON_ENV_KNOBS(DMUON_DECLARE_KNOB)
#undef DMUON_DECLARE_KNOB

/// An option's value: `requested` when given; else the knob's value now (its fallback when
/// unset). So an explicit option always wins, and a set variable overrides only a default.
template <class T, class K>
T resolve(const std::optional<T>& requested, const Knob<K>& knob) {
  return requested.has_value() ? *requested : static_cast<T>(knob.get());
}

/// A knob as docs/configuration.md lists it (dmuon._C.env_knobs() in Python).
struct KnobInfo {
  std::string name, type, fallback, kind, what;
  std::string value;  ///< its value now ("" when unset)
};
/// Every knob, in declaration order.
std::vector<KnobInfo> all_knobs();

}  // namespace dmuon::env
