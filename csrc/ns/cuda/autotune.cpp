// dmuon/ns/cuda/autotune.cpp — candidate enumeration, checks, timing and caching of the
// CUDA NS backend's configurations (see autotune.h).
#include "ns/cuda/autotune.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "autotune/timing_rounds.h"
#include "ns/cuda/autotune_rules.h"
#include "common/check.h"
#include "common/env.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/elementwise.h"
#include "ns/cuda/sm90_sym_product.h"
#include "ns/cuda/tri_sym_product.h"

#ifndef DMUON_VERSION
#define DMUON_VERSION "unknown"
#endif

namespace dmuon::ns::cuda {
namespace {

using autotune::TuneEntry;
using autotune::TuneKey;

// NOTE: tuning compares every candidate with a reference copy of the output; above this
// many bytes of scratch (e.g. a batch of 64 4096×4096 products) the untuned default runs
// instead of risking an out-of-memory next to the model.
constexpr size_t kMaxScratchBytes = size_t{4} << 30;

std::mutex g_mutex;
std::map<std::string, std::unique_ptr<autotune::TuneCache>> g_caches;  // gpu name → cache
std::map<int, std::string> g_device_names;                            // device → gpu name
std::set<std::string> g_reported;
std::string g_cache_path;
bool g_path_resolved = false;
std::atomic<int64_t> g_measurements{0};

std::string gpu_name(int device) {
  auto it = g_device_names.find(device);
  if (it != g_device_names.end()) return it->second;
  cudaDeviceProp prop{};
  DMUON_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return g_device_names[device] = prop.name;
}

autotune::TuneEnvironment environment_of(const std::string& name) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return {name, std::to_string(driver), std::to_string(runtime), DMUON_VERSION};
}

// Scratch device memory for one tuning, stream-ordered; null when unavailable.
struct Scratch {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  Scratch(size_t bytes, cudaStream_t s) : stream(s) {
    if (bytes > kMaxScratchBytes || cudaMallocAsync(&ptr, bytes, s) != cudaSuccess) {
      cudaGetLastError();  // NOTE: an out-of-memory here only means "do not tune"
      ptr = nullptr;
    }
  }
  ~Scratch() {
    if (ptr) cudaFreeAsync(ptr, stream);
  }
};

size_t span_bytes(int64_t batch, int64_t rows, int64_t ld, int64_t stride) {
  return static_cast<size_t>((batch - 1) * stride + (rows - 1) * ld + ld) * 2;
}

// Test hook: DMUON_AUTOTUNE_TEST_BREAK=<prefix> perturbs (α·1.5) every candidate whose
// name starts with the prefix, so that tests can show a failing candidate never wins.
bool broken_for_testing(const std::string& config) {
  const std::string prefix = env::kAutotuneTestBreak.get();
  return !prefix.empty() && config.rfind(prefix, 0) == 0;
}

// The kernel's scratch (split-K slices) is the cuBLASLt workspace unless the call brings its
// own. NOTE: both are stream-ordered on the call's stream: never in use by two kernels at once.
SymProductArgs with_scratch(const SymProductArgs& args, void* workspace, size_t workspace_bytes) {
  SymProductArgs out = args;
  if (out.scratch == nullptr) {
    out.scratch = workspace;
    out.scratch_bytes = workspace == nullptr ? 0 : workspace_bytes;
  }
  return out;
}

// The current device's SM count (0 when it cannot be read): the split-K configurations' rule.
int current_num_sms() {
  int device = 0, num_sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return num_sms;
}

}  // namespace

const char* dtype_name(DType dtype) { return dtype == DType::kFloat16 ? "float16" : "bfloat16"; }

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Rounds in which the candidates that passed their check are timed in turns
// (autotune/timing_rounds.h); runs under this many ms are timed twice a turn.
constexpr int kTimingRounds = 3;
constexpr double kShortRunMs = 2.0;

std::vector<double> time_in_turns(const std::vector<std::function<void()>>& runs, cudaStream_t stream,
                                  std::vector<std::string>* errors) {
  errors->assign(runs.size(), "");
  cudaEvent_t start, end;
  DMUON_CHECK_CUDA(cudaEventCreate(&start));
  DMUON_CHECK_CUDA(cudaEventCreate(&end));
  const std::vector<double> medians =
      autotune::medians_in_turns(runs.size(), kTimingRounds, kShortRunMs, [&](size_t i) -> double {
        try {
          DMUON_CHECK_CUDA(cudaEventRecord(start, stream));
          runs[i]();
          DMUON_CHECK_CUDA(cudaEventRecord(end, stream));
          DMUON_CHECK_CUDA(cudaEventSynchronize(end));
          float ms = 0.f;
          DMUON_CHECK_CUDA(cudaEventElapsedTime(&ms, start, end));
          return ms;
        } catch (const Error& error) {
          (*errors)[i] = error.what();
          return -1.0;
        }
      });
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return medians;
}

void sym_product_with(const SymProductArgs& args, const std::string& config, void* lt_workspace,
                      size_t lt_workspace_bytes, cudaStream_t stream) {
  const int lt = parse_lt(config);
  if (lt >= 0) {
    const GemmDesc g = dense_desc(args);
    gemm(g, args.alpha, args.a, args.b, args.c == nullptr ? 0.0 : args.beta, args.c, args.d,
         lt_workspace, lt_workspace_bytes, stream, lt);
    mirror_lower(args.dtype, args.d, args.batch, args.m, args.ldd, args.stride_d, stream);
    return;
  }
  const int64_t panels = parse_tri(config), blocks = parse_blk(config);
  DMUON_CHECK((panels > 0 || config.rfind("tri:", 0) != 0) && (blocks > 0 || config.rfind("blk:", 0) != 0),
              "symmetric-product configuration ", config, ": the block must be a positive multiple of ",
              kTriBlockQuantum, " rows");
  if (panels > 0) {
    tri_sym_product(args, panels, lt_workspace, lt_workspace_bytes, stream);
    return;
  }
  if (blocks > 0) {
    block_sym_product(args, blocks, lt_workspace, lt_workspace_bytes, stream);
    return;
  }
  Sm90SymConfig kernel;
  DMUON_CHECK(Sm90SymConfig::parse(config, &kernel), "symmetric-product configuration: ", sm90_sym_name_rejects(config));
#if defined(DMUON_WITH_SM90_SYM)
  sm90_sym_product(with_scratch(args, lt_workspace, lt_workspace_bytes), kernel, stream);
#else
  DMUON_FAIL("the sm_90a symmetric kernel is not part of this build (no CUTLASS headers)");
#endif
}

Autotuner& Autotuner::instance() {
  static Autotuner tuner;
  return tuner;
}

bool Autotuner::enabled() const {
  return env::kAutotune.get();
}

int64_t Autotuner::num_measurements() const { return g_measurements.load(); }

autotune::TuneCache& Autotuner::cache() {
  int device = 0;
  DMUON_CHECK_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_path_resolved) {
    g_cache_path = autotune::default_cache_path();
    g_path_resolved = true;
  }
  const std::string name = gpu_name(device);
  auto& slot = g_caches[name];
  if (!slot) {
    slot = std::make_unique<autotune::TuneCache>(environment_of(name));
    if (!g_cache_path.empty()) slot->load(g_cache_path);
  }
  return *slot;
}

std::optional<TuneEntry> Autotuner::lookup(const TuneKey& key) { return cache().get(key); }

std::string Autotuner::cache_path() {
  cache();  // NOTE: resolves the path
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_cache_path;
}

autotune::TuneEnvironment Autotuner::environment() { return cache().environment(); }

void Autotuner::report(const TuneKey& key, const TuneEntry& entry, const char* how) {
  if (!env::kPrintConfigs.get()) return;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_reported.insert(key.str()).second) return;
  }
  std::fprintf(stderr, "dmuon: config %s m=%lld n=%lld k=%lld batch=%lld %s %s -> %s (%.4f ms, %s)\n",
               key.op.c_str(), static_cast<long long>(key.m), static_cast<long long>(key.n),
               static_cast<long long>(key.k), static_cast<long long>(key.batch), key.dtype.c_str(),
               key.extra.c_str(), entry.config.c_str(), entry.time_ms, how);
}

void Autotuner::record(const TuneKey& key, const TuneEntry& entry) {
  autotune::TuneCache& c = cache();
  c.put(key, entry);
  std::string path;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    path = g_cache_path;
  }
  if (!path.empty()) c.save_or_warn(path);
  report(key, entry, "tuned");
}

void Autotuner::sym_product(const SymProductArgs& call_args, SymMode mode, void* lt_workspace,
                            size_t lt_workspace_bytes, cudaStream_t stream) {
  const SymProductArgs args = with_scratch(call_args, lt_workspace, lt_workspace_bytes);
  const std::string fallback = sym_default_config(mode, args.m);
  TuneKey key{"sym", args.m, args.m, args.k, args.batch, dtype_name(args.dtype),
              std::string(args.beta != 0.0 ? "beta" : "nobeta") + sym_mode_tag(mode)};
  const auto num_lt_algos = [&] {
    if (!sym_paths(mode).dense) return 0;
    return gemm_num_algos(dense_desc(args), args.beta != 0.0 && args.c != nullptr,
                          lt_workspace == nullptr ? 0 : lt_workspace_bytes);
  };
  if (auto hit = lookup(key)) {
    // NOTE: a cached name that does not apply to these operands (alignment) is skipped. Only
    // what the name needs is queried: a kernel winner builds no cuBLASLt plan.
    Sm90SymConfig cached;
    const bool split_k = Sm90SymConfig::parse(hit->config, &cached) && cached.split_k;
    if (cached_sym_winner_applies(hit->config, args, mode, parse_lt(hit->config) >= 0 ? num_lt_algos() : 0,
                                  sm90_sym_configs(), split_k ? current_num_sms() : 0)) {
      report(key, *hit, "cached");
      sym_product_with(args, hit->config, lt_workspace, lt_workspace_bytes, stream);
      return;
    }
  }
  if (!may_tune(enabled(), stream_is_capturing(stream))) {
    report(key, {fallback, 0.0}, "default");
    sym_product_with(args, fallback, lt_workspace, lt_workspace_bytes, stream);
    return;
  }

  // Reference: cuBLASLt's first algorithm, mirrored, into scratch with D's layout.
  const size_t bytes = span_bytes(args.batch, args.m, args.ldd, args.stride_d);
  Scratch scratch(bytes, stream);
  if (scratch.ptr == nullptr) {
    report(key, {fallback, 0.0}, "default (no scratch memory to tune)");
    sym_product_with(args, fallback, lt_workspace, lt_workspace_bytes, stream);
    return;
  }
  SymProductArgs ref_args = args;
  ref_args.d = scratch.ptr;
  sym_product_with(ref_args, "lt:0", lt_workspace, lt_workspace_bytes, stream);

#if defined(DMUON_WITH_SM90_SYM)
  constexpr bool kKernelBuilt = true;
#else
  constexpr bool kKernelBuilt = false;
#endif
  const std::vector<std::string> candidates =
      sym_candidates(args, mode, kKernelBuilt, sm90_sym_configs(), num_lt_algos(), current_num_sms());

  // Every candidate checked against the reference; those that pass are then timed in turns.
  auto reject = [&](const std::string& config, const std::string& why) {
    report({key.op, key.m, key.n, key.k, key.batch, key.dtype, key.extra + " candidate " + config}, {config, 0.0},
           ("rejected: " + why).c_str());
  };
  std::vector<std::string> passed;
  std::vector<std::function<void()>> runs;
  for (const std::string& config : candidates) {
    SymProductArgs run_args = args;
    if (broken_for_testing(config)) run_args.alpha *= 1.5;
    auto run = [=] { sym_product_with(run_args, config, lt_workspace, lt_workspace_bytes, stream); };
    std::string why;
    try {
      run();
      const CompareStats s = compare_16bit(args.dtype, args.d, scratch.ptr, args.batch, args.m, args.m,
                                           args.ldd, args.stride_d, /*check_symmetric=*/true, stream);
      why = check_rejects(s, args.dtype, /*symmetric=*/true);
      if (!why.empty()) {
        reject(config, why);
        continue;
      }
      passed.push_back(config);
      runs.push_back(run);
    } catch (const Error& error) {
      reject(config, error.what());
    }
  }
  std::vector<std::string> errors;
  const std::vector<double> times = time_in_turns(runs, stream, &errors);
  for (size_t i = 0; i < passed.size(); ++i) {
    if (std::isnan(times[i])) {
      reject(passed[i], errors[i]);
      continue;
    }
    ++g_measurements;
  }
  const std::optional<size_t> winner = fastest(times);
  const std::string best = winner ? passed[*winner] : std::string();
  const double best_ms = winner ? times[*winner] : 0.0;
  DMUON_CHECK(!best.empty(), "autotune: no candidate passed the check for the symmetric product ", key.str());
  // The winner's result in D (the last candidate run may have been another one).
  sym_product_with(args, best, lt_workspace, lt_workspace_bytes, stream);
  record(key, {best, best_ms});
}

void Autotuner::gemm(const GemmDesc& g, double alpha, const void* a, const void* b, double beta,
                     const void* c, void* d, void* lt_workspace, size_t lt_workspace_bytes,
                     cudaStream_t stream) {
  const bool has_c = c != nullptr && beta != 0.0;
  TuneKey key{"gemm", g.m, g.n, g.k, g.batch, dtype_name(g.dtype),
              std::string(has_c ? "beta" : "nobeta") + (g.transpose_b ? ":tb" : "")};
  auto run_with = [&](int algo, double a_scale, void* out) {
    cuda::gemm(g, alpha * a_scale, a, b, has_c ? beta : 0.0, has_c ? c : nullptr, out, lt_workspace,
               lt_workspace_bytes, stream, algo);
  };
  const size_t ws_bytes = lt_workspace == nullptr ? 0 : lt_workspace_bytes;
  const int num = gemm_num_algos(g, has_c, ws_bytes);
  if (auto hit = lookup(key)) {
    if (cached_gemm_winner_applies(hit->config, num)) {
      report(key, *hit, "cached");
      run_with(parse_lt(hit->config), 1.0, d);
      return;
    }
  }
  switch (gemm_tuning(enabled(), stream_is_capturing(stream), num)) {
    case GemmTuning::kDefault:
      report(key, {"lt:0", 0.0}, "default");
      run_with(0, 1.0, d);
      return;
    case GemmTuning::kRecordOnly:
      run_with(0, 1.0, d);
      record(key, {"lt:0", 0.0});
      return;
    case GemmTuning::kSearch:
      break;
  }
  Scratch scratch(span_bytes(g.batch, g.m, g.ldd, g.stride_d), stream);
  if (scratch.ptr == nullptr) {
    report(key, {"lt:0", 0.0}, "default (no scratch memory to tune)");
    run_with(0, 1.0, d);
    return;
  }
  run_with(0, 1.0, scratch.ptr);
  // Every algorithm checked against algorithm 0's result; those that pass timed in turns.
  std::vector<int> passed;
  std::vector<std::function<void()>> runs;
  for (int algo = 0; algo < num; ++algo) {
    const std::string name = "lt:" + std::to_string(algo);
    const double scale = broken_for_testing(name) ? 1.5 : 1.0;
    std::string why;
    try {
      run_with(algo, scale, d);
      const CompareStats s = compare_16bit(g.dtype, d, scratch.ptr, g.batch, g.m, g.n, g.ldd, g.stride_d,
                                           /*check_symmetric=*/false, stream);
      if (!check_rejects(s, g.dtype, /*symmetric=*/false).empty()) continue;
      passed.push_back(algo);
      runs.push_back([=] { run_with(algo, scale, d); });
    } catch (const Error&) {
      continue;
    }
  }
  std::vector<std::string> errors;
  const std::vector<double> times = time_in_turns(runs, stream, &errors);
  for (size_t i = 0; i < passed.size(); ++i)
    if (!std::isnan(times[i])) ++g_measurements;
  const std::optional<size_t> winner = fastest(times);
  const int best = winner ? passed[*winner] : -1;
  const double best_ms = winner ? times[*winner] : 0.0;
  DMUON_CHECK(best >= 0, "autotune: no cuBLASLt algorithm passed the check for ", key.str());
  run_with(best, 1.0, d);
  record(key, {"lt:" + std::to_string(best), best_ms});
}

}  // namespace dmuon::ns::cuda
