// The autotuner's decisions (csrc/ns/cuda/autotune_rules.h), on the host: a candidate passes
// its check only when finite, within tolerance and symmetric; the fastest timed one wins;
// what runs untuned; when a cached winner may run again. No GPU needed.
#include "ns/cuda/autotune_rules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "aligned_sym_args.h"

namespace dmuon::ns::cuda {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

SymProductArgs aligned_args(double beta = 0.0) {
  SymProductArgs args = dmuon::testing::aligned_sym_args(2, 64, 64, 64);
  args.beta = beta;
  return args;
}

CompareStats stats(float max_abs_diff, float max_abs_ref, unsigned nonfinite = 0, unsigned asymmetric = 0) {
  CompareStats s;
  s.max_abs_diff = max_abs_diff, s.max_abs_ref = max_abs_ref, s.nonfinite = nonfinite, s.asymmetric = asymmetric;
  return s;
}

TEST(AutotuneRules, ACandidatePassesWithinTheToleranceOfItsDtypeOnly) {
  EXPECT_EQ(check_rejects(stats(3.9e-3f, 1.f), DType::kFloat16, true), "");
  EXPECT_NE(check_rejects(stats(4.1e-3f, 1.f), DType::kFloat16, true), "");
  // bf16 has 3 fewer mantissa bits: its limit is 3e-2, relative to the reference's largest element.
  EXPECT_EQ(check_rejects(stats(2.9e-2f, 1.f), DType::kBFloat16, true), "");
  EXPECT_NE(check_rejects(stats(3.1e-2f, 1.f), DType::kBFloat16, true), "");
  EXPECT_EQ(check_rejects(stats(0.39f, 100.f), DType::kFloat16, true), "");
  EXPECT_NE(check_rejects(stats(0.41f, 100.f), DType::kFloat16, true), "");
}

TEST(AutotuneRules, NonFiniteAsymmetricOrNaNResultsAreRejectedWithTheReason) {
  const std::string nonfinite = check_rejects(stats(0.f, 1.f, 3), DType::kFloat16, false);
  EXPECT_NE(nonfinite.find("3 non-finite"), std::string::npos) << nonfinite;
  const std::string asymmetric = check_rejects(stats(0.f, 1.f, 0, 5), DType::kFloat16, true);
  EXPECT_NE(asymmetric.find("5 asymmetric"), std::string::npos) << asymmetric;
  // A dense product need not be symmetric.
  EXPECT_EQ(check_rejects(stats(0.f, 1.f, 0, 5), DType::kFloat16, false), "");
  // A NaN error never passes (the comparison must not be written as "diff > limit").
  EXPECT_NE(check_rejects(stats(std::nanf(""), 1.f), DType::kFloat16, false), "");
  const std::string too_far = check_rejects(stats(1.f, 1.f), DType::kFloat16, false);
  EXPECT_NE(too_far.find("max error 1 (limit 0.004)"), std::string::npos) << too_far;
}

TEST(AutotuneRules, TheFastestTimedCandidateWinsAndFailedRunsNever) {
  EXPECT_EQ(fastest({3.0, 1.5, 2.0}), 1u);
  EXPECT_EQ(fastest({kNaN, 2.0, kNaN, 1.0}), 3u);
  EXPECT_EQ(fastest({kNaN, 0.5}), 1u);
  EXPECT_EQ(fastest({2.0, 1.0, 1.0}), 1u);  // the first of equal times
  EXPECT_FALSE(fastest({kNaN, kNaN}).has_value());
  EXPECT_FALSE(fastest({}).has_value());
}

TEST(AutotuneRules, UntunedCallsRunTheDefaultOfTheirMode) {
  EXPECT_EQ(sym_default_config(SymMode::kKernel, 4096), "sm90:direct:s5:c0");
  EXPECT_EQ(sym_default_config(SymMode::kKernelOnly, 64), "sm90:direct:s5:c0");
  EXPECT_EQ(sym_default_config(SymMode::kDenseMirror, 4096), "lt:0");
  // The portable product from m = 1024 (four panels), or whenever it is forced.
  EXPECT_EQ(sym_default_config(SymMode::kPortable, 1023), "lt:0");
  EXPECT_EQ(sym_default_config(SymMode::kPortable, 1024), "tri:256");
  EXPECT_EQ(sym_default_config(SymMode::kPortable, 4097), "tri:1152");
  EXPECT_EQ(sym_default_config(SymMode::kPortableOnly, 100), "tri:128");
  EXPECT_EQ(sym_default_config(SymMode::kPortableOnly, 1001), "tri:256");
  EXPECT_EQ(sym_default_config(SymMode::kPanelsOnly, 1001), "tri:256");
  // The lower blocks only where they alone are allowed.
  EXPECT_EQ(sym_default_config(SymMode::kBlocksOnly, 511), "blk:128");
  EXPECT_EQ(sym_default_config(SymMode::kBlocksOnly, 4096), "blk:256");
  EXPECT_TRUE(may_tune(true, false));
  EXPECT_FALSE(may_tune(false, false));  // DMUON_AUTOTUNE=0
  EXPECT_FALSE(may_tune(true, true));    // a CUDA graph is being captured
  EXPECT_EQ(gemm_tuning(true, false, 4), GemmTuning::kSearch);
  EXPECT_EQ(gemm_tuning(true, false, 1), GemmTuning::kRecordOnly);
  EXPECT_EQ(gemm_tuning(false, false, 4), GemmTuning::kDefault);
  EXPECT_EQ(gemm_tuning(true, true, 4), GemmTuning::kDefault);
}

TEST(AutotuneRules, CandidatesAreTheApplicableKernelConfigsThenEveryLtAlgorithm) {
  const std::vector<Sm90SymConfig> configs = sm90_sym_configs();
  SymProductArgs args = aligned_args();
  // NOTE: only the size and alignment of the scratch are rules; nothing is written here.
  alignas(256) static char scratch[256];
  args.scratch = scratch;
  args.scratch_bytes = sm90_sym_split_scratch_bytes(132, 256);
  const auto all = sym_candidates(args, SymMode::kKernel, true, configs, 3, 132);
  ASSERT_EQ(all.size(), configs.size() + 3);
  for (size_t i = 0; i < configs.size(); ++i) EXPECT_EQ(all[i], configs[i].name());
  EXPECT_EQ(all[configs.size()], "lt:0");
  EXPECT_EQ(all.back(), "lt:2");
  // Dense-mirror mode, or a build without the kernel: cuBLASLt only.
  EXPECT_EQ(sym_candidates(args, SymMode::kDenseMirror, true, configs, 2, 132),
            (std::vector<std::string>{"lt:0", "lt:1"}));
  EXPECT_EQ(sym_candidates(args, SymMode::kKernel, false, configs, 1, 132), (std::vector<std::string>{"lt:0"}));
  // Without scratch the split-K configurations cannot run; a misaligned D drops the
  // epilogues that store by TMA or stage through shared memory.
  size_t num_split = 0;
  for (const Sm90SymConfig& c : configs) num_split += c.split_k;
  ASSERT_GT(num_split, 0u);
  args.scratch = nullptr;
  args.scratch_bytes = 0;
  EXPECT_EQ(sym_candidates(args, SymMode::kKernel, true, configs, 0, 132).size(), configs.size() - num_split);
  args.ldd = 60;
  for (const std::string& name : sym_candidates(args, SymMode::kKernel, true, configs, 0, 132)) {
    Sm90SymConfig c;
    ASSERT_TRUE(Sm90SymConfig::parse(name, &c)) << name;
    EXPECT_EQ(c.epilogue, Sm90Epilogue::kDirect) << name;
  }
}

TEST(AutotuneRules, EachModeOffersTheCandidatesOfItsPaths) {
  const std::vector<Sm90SymConfig> configs = sm90_sym_configs();
  const SymProductArgs args = dmuon::testing::aligned_sym_args(1, 1001, 64, 1008);
  const std::vector<std::string> blk = {"blk:128", "blk:256", "blk:384"};
  const std::vector<std::string> tri = {"tri:512", "tri:384", "tri:256", "tri:128"};
  std::vector<std::string> portable = blk;
  portable.insert(portable.end(), tri.begin(), tri.end());
  auto with_lt = [&](std::vector<std::string> names) {
    names.push_back("lt:0"), names.push_back("lt:1");
    return names;
  };
  EXPECT_EQ(sym_candidates(args, SymMode::kPortable, true, configs, 2, 132), with_lt(portable));
  EXPECT_EQ(sym_candidates(args, SymMode::kPortableOnly, true, configs, 2, 132), portable);
  EXPECT_EQ(sym_candidates(args, SymMode::kBlocksOnly, true, configs, 2, 132), blk);
  EXPECT_EQ(sym_candidates(args, SymMode::kPanelsOnly, true, configs, 2, 132), tri);
  EXPECT_EQ(sym_candidates(args, SymMode::kDenseMirror, true, configs, 2, 132), with_lt({}));
  // Kernel mode: the kernel's configurations first, then the portable products and cuBLASLt.
  const auto all = sym_candidates(args, SymMode::kKernel, true, configs, 2, 132);
  const size_t num_rest = portable.size() + 2;
  ASSERT_GT(all.size(), num_rest);
  EXPECT_EQ(std::vector<std::string>(all.end() - num_rest, all.end()), with_lt(portable));
  const auto kernel_only = sym_candidates(args, SymMode::kKernelOnly, true, configs, 2, 132);
  EXPECT_EQ(kernel_only, std::vector<std::string>(all.begin(), all.end() - num_rest));
  EXPECT_TRUE(sym_candidates(args, SymMode::kKernelOnly, false, configs, 2, 132).empty());
  // Too small for two panels or block rows: the portable path adds nothing unless it is forced.
  const SymProductArgs small = dmuon::testing::aligned_sym_args(1, 255, 64, 256);
  EXPECT_EQ(sym_candidates(small, SymMode::kPortable, true, configs, 1, 132), (std::vector<std::string>{"lt:0"}));
  EXPECT_EQ(sym_candidates(small, SymMode::kPortableOnly, true, configs, 1, 132),
            (std::vector<std::string>{"tri:256"}));
  EXPECT_EQ(sym_candidates(small, SymMode::kBlocksOnly, true, configs, 1, 132),
            (std::vector<std::string>{"blk:128"}));
}

TEST(AutotuneRules, DmuonSymPathChoosesTheModeAndRefusesWhatCannotRun) {
  // auto: the kernel where usable, else portable or dense; sym_kernel=false keeps dense only.
  EXPECT_EQ(choose_sym_mode("", true, true), SymMode::kKernel);
  EXPECT_EQ(choose_sym_mode("auto", false, true), SymMode::kPortable);
  EXPECT_EQ(choose_sym_mode("auto", true, false), SymMode::kDenseMirror);
  EXPECT_EQ(choose_sym_mode("portable", true, true), SymMode::kPortableOnly);
  EXPECT_EQ(choose_sym_mode("blocks", true, true), SymMode::kBlocksOnly);
  EXPECT_EQ(choose_sym_mode("panels", true, true), SymMode::kPanelsOnly);
  EXPECT_EQ(choose_sym_mode("dense", true, true), SymMode::kDenseMirror);
  EXPECT_EQ(choose_sym_mode("sm90", true, true), SymMode::kKernelOnly);
  auto error_of = [](const std::string& forced, bool usable) {
    try {
      choose_sym_mode(forced, usable, true);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("sm90", false).find("DMUON_SYM_PATH=sm90"), std::string::npos);
  EXPECT_NE(error_of("tri", true).find("DMUON_SYM_PATH=tri: expected auto, sm90, portable, blocks, panels or dense"),
            std::string::npos);
  // Every mode has its own tune-cache keys; kKernel keeps the keys it had.
  std::vector<std::string> tags;
  for (SymMode m : {SymMode::kKernel, SymMode::kDenseMirror, SymMode::kPortable, SymMode::kKernelOnly,
                    SymMode::kPortableOnly, SymMode::kBlocksOnly, SymMode::kPanelsOnly})
    tags.push_back(sym_mode_tag(m));
  EXPECT_EQ(tags, (std::vector<std::string>{"", ":dense", ":portable", ":sm90-only", ":portable-only",
                                            ":blocks-only", ":panels-only"}));
}

TEST(AutotuneRules, ACachedWinnerRunsAgainOnlyWhereItIsStillACandidate) {
  const std::vector<Sm90SymConfig> configs = sm90_sym_configs();
  const SymProductArgs args = aligned_args();
  // cuBLASLt algorithm i while the heuristic still offers it.
  EXPECT_TRUE(cached_sym_winner_applies("lt:2", args, SymMode::kKernel, 3, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("lt:3", args, SymMode::kKernel, 3, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("lt:0", args, SymMode::kDenseMirror, 1, configs, 132));
  // A kernel configuration: in kernel mode only, where it applies, when it is a candidate.
  EXPECT_TRUE(cached_sym_winner_applies("sm90:staged:s5:c0", args, SymMode::kKernel, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("sm90:staged:s5:c0", args, SymMode::kDenseMirror, 1, configs, 132));
  SymProductArgs misaligned = args;
  misaligned.ldd = 60;
  EXPECT_FALSE(cached_sym_winner_applies("sm90:staged:s5:c0", misaligned, SymMode::kKernel, 1, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("sm90:direct:s5:c0", misaligned, SymMode::kKernel, 1, configs, 132));
  // A winner that is not among the candidates given (e.g. cached by a build with the
  // experimental configurations) is tuned again; in a build without them its name does not
  // even parse.
  const std::string experimental = sm90_sym_experimental_configs().front().name();
  std::vector<Sm90SymConfig> defaults;
  for (const Sm90SymConfig& c : configs)
    if (c.name() != experimental) defaults.push_back(c);
  EXPECT_FALSE(cached_sym_winner_applies(experimental, args, SymMode::kKernel, 1, defaults, 132));
  EXPECT_EQ(cached_sym_winner_applies(experimental, args, SymMode::kKernel, 1, sm90_sym_experimental_configs(), 132),
            sm90_sym_experimental_built());
  // A portable block wherever the mode allows the portable path; cuBLASLt and the kernel
  // not where another path is forced.
  EXPECT_TRUE(cached_sym_winner_applies("tri:384", args, SymMode::kPortable, 1, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("tri:384", args, SymMode::kKernel, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("tri:384", args, SymMode::kDenseMirror, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("tri:384", args, SymMode::kKernelOnly, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("tri:384", args, SymMode::kBlocksOnly, 1, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("tri:384", args, SymMode::kPanelsOnly, 1, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("blk:256", args, SymMode::kPortable, 1, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("blk:256", args, SymMode::kKernel, 1, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("blk:256", args, SymMode::kBlocksOnly, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("blk:256", args, SymMode::kPanelsOnly, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("blk:256", args, SymMode::kDenseMirror, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("lt:0", args, SymMode::kPortableOnly, 1, configs, 132));
  EXPECT_FALSE(cached_sym_winner_applies("sm90:direct:s5:c0", args, SymMode::kPortable, 1, configs, 132));
  EXPECT_TRUE(cached_sym_winner_applies("sm90:direct:s5:c0", args, SymMode::kKernelOnly, 1, configs, 132));
  // Names that mean nothing are tuned again.
  for (const char* name : {"", "lt:", "lt:x", "lt:-1", "lt:1x", "sm90:fancy:s5:c0", "standard", "tri:", "tri:100",
                           "tri:0", "tri:12x", "blk:", "blk:100", "blk:0"})
    EXPECT_FALSE(cached_sym_winner_applies(name, args, SymMode::kKernel, 4, configs, 132)) << name;
  // Dense products: "lt:<i>" with i below the heuristic's count.
  EXPECT_TRUE(cached_gemm_winner_applies("lt:1", 2));
  EXPECT_FALSE(cached_gemm_winner_applies("lt:2", 2));
  EXPECT_FALSE(cached_gemm_winner_applies("sm90:direct:s5:c0", 2));
  EXPECT_EQ(parse_lt("lt:17"), 17);
  EXPECT_EQ(parse_lt("lt:1x"), -1);
}

TEST(AutotuneRules, ACachedSplitKWinnerNeedsItsScratchOnThisDevice) {
  const std::vector<Sm90SymConfig> configs = sm90_sym_configs();
  std::string split;
  for (const Sm90SymConfig& c : configs)
    if (c.split_k && c.tile_n == 128) split = c.name();
  ASSERT_FALSE(split.empty());
  // NOTE: only the size and alignment of the scratch are rules; nothing is written here.
  alignas(256) static char scratch[256];
  SymProductArgs args = aligned_args();
  args.scratch = scratch;
  args.scratch_bytes = sm90_sym_split_scratch_bytes(132);
  EXPECT_TRUE(cached_sym_winner_applies(split, args, SymMode::kKernel, 1, configs, 132));
  // More SMs than the scratch was sized for, or an unknown SM count: tuned again.
  EXPECT_FALSE(cached_sym_winner_applies(split, args, SymMode::kKernel, 1, configs, 200));
  EXPECT_FALSE(cached_sym_winner_applies(split, args, SymMode::kKernel, 1, configs, 0));
}

}  // namespace
}  // namespace dmuon::ns::cuda
