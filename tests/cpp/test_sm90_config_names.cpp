// Names of the sm_90a symmetric kernel's configurations (csrc/ns/cuda/sm90_sym_config.cpp):
// every candidate's name parses back to itself, and names of instances that are not built
// are refused. Host code only; no GPU needed.
#include <gtest/gtest.h>

#include <string>

#include "ns/cuda/sm90_sym_product.h"

namespace {

using dmuon::ns::cuda::Sm90Epilogue;
using dmuon::ns::cuda::Sm90SymConfig;

TEST(Sm90ConfigNames, EveryCandidateRoundTrips) {
  for (const Sm90SymConfig& c : dmuon::ns::cuda::sm90_sym_configs()) {
    Sm90SymConfig parsed;
    ASSERT_TRUE(Sm90SymConfig::parse(c.name(), &parsed)) << c.name();
    EXPECT_EQ(parsed.name(), c.name());
  }
  for (const Sm90SymConfig& c : dmuon::ns::cuda::sm90_sym_experimental_configs()) {
    Sm90SymConfig parsed;
    EXPECT_TRUE(Sm90SymConfig::parse(c.name(), &parsed)) << c.name();
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

}  // namespace
