// dmuon/autotune/tune_cache.h — the on-disk cache of autotuning results (torch-free, no CUDA).
//
// One text file holds every tuned choice of one environment (GPU name, driver, CUDA
// runtime, dmuon version). It is never trusted: a file that is corrupt, truncated, or
// written for another environment is ignored with ONE warning per path and rebuilt.
// Writes go tmp (pid-unique) → fsync → atomic rename; a writer first merges the entries
// already on disk, so several ranks saving at once lose nothing but a race's last entries.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace dmuon::autotune {

/// What the measurements depend on besides the problem: a tuned file is only used when
/// every field matches.
struct TuneEnvironment {
  std::string gpu_name;
  std::string driver;        ///< driver version (e.g. "13000" from cudaDriverGetVersion)
  std::string cuda_runtime;  ///< runtime version the kernels run under
  std::string dmuon_version;
  std::string describe() const;  ///< one line, '|'-separated
};

/// Key of one tuned problem: (op, m, n, batch, dtype) plus free-form extra (e.g. "beta").
struct TuneKey {
  std::string op;  ///< "sym", "gemm", "ns", …
  int64_t m = 0, n = 0, k = 0, batch = 0;
  std::string dtype;
  std::string extra;
  std::string str() const;  ///< canonical text form (no tabs or newlines)
  bool operator<(const TuneKey& other) const { return str() < other.str(); }
};

/// One result: the winning configuration's name and its measured time.
struct TuneEntry {
  std::string config;  ///< e.g. "kernel:staged:s5:ctas0" or "lt:algo3"
  double time_ms = 0.0;
};

/// Thread-safe in-memory table with load/save of the file format.
class TuneCache {
 public:
  explicit TuneCache(TuneEnvironment environment) : environment_(std::move(environment)) {}

  const TuneEnvironment& environment() const { return environment_; }

  std::optional<TuneEntry> get(const TuneKey& key) const;
  void put(const TuneKey& key, const TuneEntry& entry);
  size_t size() const;

  /// Merge the entries of `path` (if it exists and is valid for this environment) into
  /// this table; entries already in memory win. Returns false — after one warning per
  /// path and process through `warn` — when the file is corrupt, truncated or stale.
  /// A missing file is not a warning (returns true).
  bool load(const std::string& path);

  /// Write this table (merged with a valid file already at `path`) atomically.
  /// Creates the parent directory. Throws dmuon::Error when the file cannot be written.
  void save(const std::string& path) const;
  /// save(), except that a file that cannot be written is one warning per path and
  /// process (an unwritable cache costs re-measuring in the next process, nothing else).
  void save_or_warn(const std::string& path) const;

  /// Where warnings go (default: stderr, "dmuon: warning: …"). Tests capture them.
  static void set_warning_sink(std::function<void(const std::string&)> sink);

 private:
  TuneEnvironment environment_;
  mutable std::mutex mutex_;
  std::map<std::string, std::pair<TuneKey, TuneEntry>> entries_;  // key.str() → entry
};

/// Parse the text of a cache file. Returns the entries when the text is complete and
/// its environment line equals `environment`; otherwise nullopt and the reason in `why`.
std::optional<std::map<std::string, std::pair<TuneKey, TuneEntry>>> parse_cache_text(
    const std::string& text, const TuneEnvironment& environment, std::string* why);

/// The text form of entries for `environment` (what save() writes).
std::string format_cache_text(const std::map<std::string, std::pair<TuneKey, TuneEntry>>& entries,
                              const TuneEnvironment& environment);

/// Default cache path: $DMUON_AUTOTUNE_CACHE, else $XDG_CACHE_HOME/dmuon/autotune.txt,
/// else ~/.cache/dmuon/autotune.txt. "none" or "0" disables the on-disk cache (empty result).
std::string default_cache_path();

/// Forget which paths already warned (tests only).
void reset_warnings_for_testing();

}  // namespace dmuon::autotune
