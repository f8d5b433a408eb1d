// dmuon/ns/cuda/autotune_rules.cpp — the autotuner's decisions (see autotune_rules.h).
#include "ns/cuda/autotune_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/check.h"

namespace dmuon::ns::cuda {

// NOTE: both sides are fp32-accumulated and rounded once to 16 bits, so they differ by
// accumulation order and one rounding (fp16 ulp 2⁻¹⁰, bf16 2⁻⁷ relative to each element).
double check_tolerance(DType dtype) { return dtype == DType::kFloat16 ? 4e-3 : 3e-2; }

std::string check_rejects(const CompareStats& s, DType dtype, bool symmetric) {
  const double limit = check_tolerance(dtype) * std::max(static_cast<double>(s.max_abs_ref), 1e-30);
  if (s.nonfinite == 0 && !(symmetric && s.asymmetric > 0) && s.max_abs_diff <= limit) return "";
  char text[256];
  std::snprintf(text, sizeof(text), "max error %.3g (limit %.3g), %u non-finite, %u asymmetric",
                static_cast<double>(s.max_abs_diff), limit, s.nonfinite, s.asymmetric);
  return text;
}

int parse_lt(const std::string& config) {
  if (config.rfind("lt:", 0) != 0 || config.size() == 3) return -1;
  int value = 0;
  for (size_t i = 3; i < config.size(); ++i) {
    if (config[i] < '0' || config[i] > '9' || value > 100000) return -1;
    value = value * 10 + (config[i] - '0');
  }
  return value;
}

SymPaths sym_paths(SymMode mode) {
  switch (mode) {
    case SymMode::kKernel: return {true, true, true, true};
    case SymMode::kDenseMirror: return {false, false, false, true};
    case SymMode::kPortable: return {false, true, true, true};
    case SymMode::kKernelOnly: return {true, false, false, false};
    case SymMode::kPortableOnly: return {false, true, true, false};
    case SymMode::kBlocksOnly: return {false, true, false, false};
    case SymMode::kPanelsOnly: return {false, false, true, false};
  }
  return {};
}

const char* sym_mode_tag(SymMode mode) {
  switch (mode) {
    case SymMode::kKernel: return "";
    case SymMode::kDenseMirror: return ":dense";
    case SymMode::kPortable: return ":portable";
    case SymMode::kKernelOnly: return ":sm90-only";
    case SymMode::kPortableOnly: return ":portable-only";
    case SymMode::kBlocksOnly: return ":blocks-only";
    case SymMode::kPanelsOnly: return ":panels-only";
  }
  return "?";
}

const char* sym_mode_description(SymMode mode) {
  switch (mode) {
    case SymMode::kKernel:
      return "the sm_90a kernel, portable lower blocks or row panels, or dense cuBLASLt, picked per shape by the "
             "autotuner";
    case SymMode::kDenseMirror: return "dense cuBLASLt, mirrored";
    case SymMode::kPortable:
      return "portable lower blocks or row panels, or dense cuBLASLt, picked per shape by the autotuner";
    case SymMode::kKernelOnly: return "the sm_90a kernel only (DMUON_SYM_PATH=sm90)";
    case SymMode::kPortableOnly: return "portable lower blocks or row panels only (DMUON_SYM_PATH=portable)";
    case SymMode::kBlocksOnly: return "portable lower blocks only (DMUON_SYM_PATH=blocks)";
    case SymMode::kPanelsOnly: return "portable row panels only (DMUON_SYM_PATH=panels)";
  }
  return "?";
}

SymMode choose_sym_mode(const std::string& forced, bool kernel_usable, bool sym_kernel) {
  if (forced.empty() || forced == "auto") {
    if (!sym_kernel) return SymMode::kDenseMirror;
    return kernel_usable ? SymMode::kKernel : SymMode::kPortable;
  }
  if (forced == "portable") return SymMode::kPortableOnly;
  if (forced == "blocks") return SymMode::kBlocksOnly;
  if (forced == "panels") return SymMode::kPanelsOnly;
  if (forced == "dense") return SymMode::kDenseMirror;
  DMUON_CHECK(forced == "sm90", "DMUON_SYM_PATH=", forced, ": expected auto, sm90, portable, blocks, panels or dense");
  DMUON_CHECK(kernel_usable, "DMUON_SYM_PATH=sm90: the sm_90a symmetric kernel cannot run here (not built, not an "
              "sm_90 GPU, or its self-check failed)");
  return SymMode::kKernelOnly;
}

std::string sym_default_config(SymMode mode, int64_t m) {
  const SymPaths paths = sym_paths(mode);
  if (paths.kernel) return Sm90SymConfig{}.name();
  if (paths.panels && (!paths.dense || m >= kPortableDefaultMinM)) return tri_name(tri_default_block(m));
  if (paths.blocks && !paths.dense) return blk_name(blk_default_block(m));
  return "lt:0";
}

bool may_tune(bool enabled, bool capturing) { return enabled && !capturing; }

std::vector<std::string> sym_candidates(const SymProductArgs& args, SymMode mode, bool kernel_built,
                                        const std::vector<Sm90SymConfig>& configs, int num_lt_algos, int num_sms) {
  const SymPaths paths = sym_paths(mode);
  std::vector<std::string> candidates;
  if (paths.kernel && kernel_built)
    for (const Sm90SymConfig& c : configs)
      if (sm90_sym_config_rejects(args, c, num_sms).empty()) candidates.push_back(c.name());
  if (paths.blocks)
    for (int64_t block : blk_block_candidates(args.m)) candidates.push_back(blk_name(block));
  if (paths.panels)
    for (int64_t block : tri_block_candidates(args.m)) candidates.push_back(tri_name(block));
  if (candidates.empty() && !paths.kernel && !paths.dense)
    candidates.push_back(sym_default_config(mode, args.m));
  if (paths.dense)
    for (int i = 0; i < num_lt_algos; ++i) candidates.push_back("lt:" + std::to_string(i));
  return candidates;
}

bool cached_sym_winner_applies(const std::string& config, const SymProductArgs& args, SymMode mode,
                               int num_lt_algos, const std::vector<Sm90SymConfig>& configs, int num_sms) {
  const SymPaths paths = sym_paths(mode);
  const int lt = parse_lt(config);
  if (lt >= 0) return paths.dense && lt < num_lt_algos;
  if (parse_blk(config) > 0) return paths.blocks;
  if (parse_tri(config) > 0) return paths.panels;
  Sm90SymConfig c;
  if (!paths.kernel || !Sm90SymConfig::parse(config, &c) || !sm90_sym_config_rejects(args, c, num_sms).empty())
    return false;
  return std::any_of(configs.begin(), configs.end(), [&](const Sm90SymConfig& k) { return k.name() == c.name(); });
}

bool cached_gemm_winner_applies(const std::string& config, int num_algos) {
  const int algo = parse_lt(config);
  return algo >= 0 && algo < num_algos;
}

GemmTuning gemm_tuning(bool enabled, bool capturing, int num_algos) {
  if (!may_tune(enabled, capturing)) return GemmTuning::kDefault;
  return num_algos <= 1 ? GemmTuning::kRecordOnly : GemmTuning::kSearch;
}

std::optional<size_t> fastest(const std::vector<double>& times_ms) {
  std::optional<size_t> best;
  for (size_t i = 0; i < times_ms.size(); ++i)
    if (!std::isnan(times_ms[i]) && (!best || times_ms[i] < times_ms[*best])) best = i;
  return best;
}

}  // namespace dmuon::ns::cuda
