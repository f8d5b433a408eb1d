// The sm_90a symmetric kernel's configurations (csrc/ns/cuda/sm90_sym_config.h): every
// candidate's name parses back to itself, names of instances that are not built are
// refused, and sm90_sym_config_rejects names what keeps a configuration from running a
// product. Host code without CUDA; no GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>

#include "aligned_sym_args.h"
#include "ns/cuda/sm90_sym_config.h"

namespace {

using dmuon::ns::cuda::Sm90Epilogue;
using dmuon::ns::cuda::Sm90SymConfig;
using dmuon::ns::cuda::sm90_sym_config_rejects;
using dmuon::ns::cuda::SymProductArgs;

// 16-byte aligned operands with leading dimensions and batch strides multiples of 8.
SymProductArgs aligned_args() { return dmuon::testing::aligned_sym_args(3, 96, 40, 48); }

Sm90SymConfig config(const std::string& name) {
  Sm90SymConfig c;
  EXPECT_TRUE(Sm90SymConfig::parse(name, &c)) << name;
  return c;
}

// Whether the reason for refusing `args` contains `expected` ("" : not refused).
::testing::AssertionResult refuses(const SymProductArgs& args, const std::string& name, const std::string& expected,
                                   int num_sms = 132) {
  const std::string why = sm90_sym_config_rejects(args, config(name), num_sms);
  if (expected.empty() ? why.empty() : why.find(expected) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": expected '" << expected << "', got '" << why << "'";
}

TEST(Sm90ConfigNames, EveryCandidateRoundTrips) {
  for (const Sm90SymConfig& c : dmuon::ns::cuda::sm90_sym_configs()) {
    Sm90SymConfig parsed;
    ASSERT_TRUE(Sm90SymConfig::parse(c.name(), &parsed)) << c.name();
    EXPECT_EQ(parsed.name(), c.name());
  }
  // The experimental ones parse, run and are candidates only in a build that has them.
  for (const Sm90SymConfig& c : dmuon::ns::cuda::sm90_sym_experimental_configs()) {
    Sm90SymConfig parsed;
    EXPECT_EQ(Sm90SymConfig::parse(c.name(), &parsed), dmuon::ns::cuda::sm90_sym_experimental_built()) << c.name();
  }
}

// NOTE: the counts of sm90_sym_instances.def: 14 default configurations on 11 instances, 10
// experimental ones that add 7 instances (split-K shares its configuration's instance).
TEST(Sm90ConfigNames, TheCandidatesAreTheDefaultListPlusTheExperimentalOnesWhereBuilt) {
  const auto configs = dmuon::ns::cuda::sm90_sym_configs();
  const auto experimental = dmuon::ns::cuda::sm90_sym_experimental_configs();
  const bool built = dmuon::ns::cuda::sm90_sym_experimental_built();
  auto instance_of = [](Sm90SymConfig c) {
    c.split_k = false;
    return c.name();
  };
  std::set<std::string> names, experimental_names, default_instances, every_instance;
  for (const Sm90SymConfig& c : experimental) {
    EXPECT_TRUE(experimental_names.insert(c.name()).second) << "listed twice: " << c.name();
    every_instance.insert(instance_of(c));
  }
  for (const Sm90SymConfig& c : configs) {
    EXPECT_TRUE(names.insert(c.name()).second) << "listed twice: " << c.name();
    if (!experimental_names.count(c.name())) default_instances.insert(instance_of(c));
    every_instance.insert(instance_of(c));
  }
  EXPECT_EQ(experimental.size(), 10u);
  EXPECT_EQ(configs.size(), built ? 24u : 14u);
  EXPECT_EQ(default_instances.size(), 11u);
  EXPECT_EQ(every_instance.size(), 18u);
  for (const std::string& name : experimental_names) EXPECT_EQ(names.count(name), built ? 1u : 0u) << name;
  // The default candidates of every build (the autotuner's choices on an H200).
  for (const char* name : {"sm90:staged:s4:c0", "sm90:direct:s6:c0", "sm90:tmastore:s5:c0", "sm90:sk-tmastore:s5:c0",
                           "sm90:mc2-tmastore:s5:c0", "sm90:n256-tmastore:s3:c0", "sm90:mc2-n256-sk-tmastore:s3:c0"})
    EXPECT_EQ(names.count(name), 1u) << name;
  // An experimental name in a build without it: refused, and the error names the option.
  if (!built) {
    Sm90SymConfig c = experimental.front();
    EXPECT_NE(sm90_sym_config_rejects(aligned_args(), c, 132).find("DMUON_EXPERIMENTAL_KERNELS=ON"), std::string::npos);
  }
}

TEST(Sm90ConfigNames, ARefusedNameSaysWhetherItIsExperimentalOrNothing) {
  using dmuon::ns::cuda::sm90_sym_name_rejects;
  EXPECT_EQ(sm90_sym_name_rejects("sm90:tmastore:s5:c0"), "");
  const std::string experimental = "sm90:n256-staged:s3:c4";
  if (dmuon::ns::cuda::sm90_sym_experimental_built()) {
    EXPECT_EQ(sm90_sym_name_rejects(experimental), "");
  } else {
    EXPECT_NE(sm90_sym_name_rejects(experimental).find("experimental configuration, not built (build with "
                                                       "-DDMUON_EXPERIMENTAL_KERNELS=ON)"),
              std::string::npos);
  }
  for (const char* nothing : {"sm90:n256-staged:s4:c0", "sm90:mc2-tmastore:s5:c3", "lt:0", "sm90:fancy:s5:c0"}) {
    const std::string why = sm90_sym_name_rejects(nothing);
    EXPECT_NE(why.find("names no configuration"), std::string::npos) << nothing << ": " << why;
    EXPECT_NE(why.find("sm90:tmastore:s5"), std::string::npos) << why;  // the built ones are listed
  }
}

TEST(Sm90ConfigNames, NamesOfUnbuiltInstancesAreRefused) {
  Sm90SymConfig c;
  ASSERT_TRUE(Sm90SymConfig::parse("sm90:sk-tmastore:s5:c7", &c));
  EXPECT_TRUE(c.split_k);
  EXPECT_EQ(c.epilogue, Sm90Epilogue::kTmaStore);
  EXPECT_EQ(c.stages, 5);
  EXPECT_EQ(c.num_ctas, 7);
  for (const std::string unbuilt :
       {"sm90:tmastore:s6:c0", "sm90:staged:s3:c0", "sm90:sk-staged:s5:c0", "sm90:mc2-tmastore:s3:c0",
        "sm90:mc2-tmastore:s5:c3", "sm90:n256-staged:s4:c0", "sm90:n256-sk-tmastore:s3:c0", "sm90:sk-sk-tmastore:s5:c0",
        "sm90:pp-tmastore:s3:c0", "sm90:tmastore:s5:c-1", "sm90:tmastore:s5", "sm90:fancy:s5:c0"})
    EXPECT_FALSE(Sm90SymConfig::parse(unbuilt, &c)) << unbuilt;
  // NOTE: a refused name leaves the output as it was.
  EXPECT_EQ(c.name(), "sm90:sk-tmastore:s5:c7");
}

TEST(Sm90ConfigRejects, EveryBuiltConfigurationRunsAlignedOperands) {
  for (const Sm90SymConfig& c : dmuon::ns::cuda::sm90_sym_configs())
    if (!c.split_k) EXPECT_EQ(sm90_sym_config_rejects(aligned_args(), c, 132), "") << c.name();
}

TEST(Sm90ConfigRejects, NamesTheOperandThatDoesNotFit) {
  const char buffer[64] = {};
  SymProductArgs a = aligned_args();
  a.a = buffer + 2;  // NOTE: 2 bytes off any 16-byte boundary the array has
  if (reinterpret_cast<uintptr_t>(a.a) % 16 == 0) a.a = buffer + 4;
  EXPECT_TRUE(refuses(a, "sm90:direct:s5:c0", "A and B must be 16-byte aligned"));
  SymProductArgs lda = aligned_args();
  lda.lda = 44;
  EXPECT_TRUE(refuses(lda, "sm90:direct:s5:c0", "lda=44"));
  SymProductArgs stride = aligned_args();
  stride.stride_b = 100;
  EXPECT_TRUE(refuses(stride, "sm90:direct:s5:c0", "stride_b=100"));
  SymProductArgs shape = aligned_args();
  shape.k = 0;
  EXPECT_TRUE(refuses(shape, "sm90:direct:s5:c0", "invalid shape [3, 96, 0]"));
  SymProductArgs no_c = aligned_args();
  no_c.beta = 1.0, no_c.c = nullptr;
  EXPECT_TRUE(refuses(no_c, "sm90:direct:s5:c0", "beta != 0 needs C"));
}

TEST(Sm90ConfigRejects, EachEpilogueChecksTheLayoutItWrites) {
  // D's leading dimension: the direct epilogue stores per element, the others by vectors/TMA.
  SymProductArgs d = aligned_args();
  d.ldd = 50;
  EXPECT_TRUE(refuses(d, "sm90:direct:s5:c0", ""));
  EXPECT_TRUE(refuses(d, "sm90:staged:s5:c0", "the staged epilogue needs"));
  EXPECT_TRUE(refuses(d, "sm90:tmastore:s5:c0", "the tmastore epilogue needs"));
  // C matters to tmastore only when β ≠ 0 (it is read by TMA then).
  SymProductArgs c = aligned_args();
  c.ldc = 50;
  EXPECT_TRUE(refuses(c, "sm90:tmastore:s5:c0", ""));
  c.beta = 1.0;
  EXPECT_TRUE(refuses(c, "sm90:tmastore:s5:c0", "the tmastore epilogue needs"));
  EXPECT_TRUE(refuses(c, "sm90:staged:s5:c0", ""));
}

TEST(Sm90ConfigRejects, SplitKNeedsAlignedScratchForEverySm) {
  alignas(256) static char scratch[512];
  SymProductArgs args = aligned_args();
  EXPECT_TRUE(refuses(args, "sm90:sk-tmastore:s5:c0", "(none)"));
  args.scratch = scratch;
  args.scratch_bytes = dmuon::ns::cuda::sm90_sym_split_scratch_bytes(132);
  EXPECT_TRUE(refuses(args, "sm90:sk-tmastore:s5:c0", ""));
  // One SM more than the scratch holds, an unknown SM count, a misaligned scratch.
  EXPECT_TRUE(refuses(args, "sm90:sk-tmastore:s5:c0", "bytes of 256-byte aligned scratch", 133));
  EXPECT_TRUE(refuses(args, "sm90:sk-tmastore:s5:c0", "SM count, which is unknown", 0));
  // A CTA count below the SMs' needs scratch for those CTAs only.
  EXPECT_TRUE(refuses(args, "sm90:sk-tmastore:s5:c7", "", 1000));
  args.scratch = scratch + 128;
  EXPECT_TRUE(refuses(args, "sm90:sk-tmastore:s5:c0", "256-byte aligned"));
}

TEST(Sm90ConfigRejects, UnbuiltOrOddClusterConfigurationsAreRefused) {
  Sm90SymConfig unbuilt;
  unbuilt.stages = 9;
  EXPECT_NE(sm90_sym_config_rejects(aligned_args(), unbuilt, 132).find("is not built"), std::string::npos);
  Sm90SymConfig odd = config("sm90:mc2-tmastore:s5:c0");
  odd.num_ctas = 3;
  EXPECT_NE(sm90_sym_config_rejects(aligned_args(), odd, 132).find("even CTA count"), std::string::npos);
}

}  // namespace
