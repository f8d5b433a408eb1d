// Typed environment knobs: defaults, parsing, errors naming the variable, no caching, the list.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#include "common/check.h"
#include "common/env.h"

namespace {

TEST(Env, DefaultsWhenUnset) {
  ::unsetenv("DMUON_TEST_UNSET");
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_UNSET", 7), 7);
  EXPECT_TRUE(dmuon::env::get_bool("DMUON_TEST_UNSET", true));
  EXPECT_EQ(dmuon::env::get_string("DMUON_TEST_UNSET", "x"), "x");
  EXPECT_FALSE(dmuon::env::is_set("DMUON_TEST_UNSET"));
}

TEST(Env, ParsesValues) {
  ::setenv("DMUON_TEST_INT", "-42", 1);
  ::setenv("DMUON_TEST_BOOL", "Off", 1);
  ::setenv("DMUON_TEST_DOUBLE", "2.5e-3", 1);
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_INT", 0), -42);
  EXPECT_FALSE(dmuon::env::get_bool("DMUON_TEST_BOOL", true));
  EXPECT_DOUBLE_EQ(dmuon::env::get_double("DMUON_TEST_DOUBLE", 0.0), 2.5e-3);
}

TEST(Env, MalformedValueNamesTheVariable) {
  ::setenv("DMUON_TEST_BAD", "12abc", 1);
  try {
    dmuon::env::get_int("DMUON_TEST_BAD", 0);
    FAIL() << "expected an error";
  } catch (const dmuon::Error& e) {
    EXPECT_NE(std::string(e.what()).find("DMUON_TEST_BAD"), std::string::npos);
  }
  EXPECT_THROW(dmuon::env::get_bool("DMUON_TEST_BAD", false), dmuon::Error);
}

// The bug this guards: a process-wide cache of first values made the second of two
// runtimes in one process (bench ns --ungated) see the first one's value of a code-path switch.
TEST(Env, ChangedVariableIsSeenByTheNextRead) {
  ::setenv("DMUON_TEST_CHANGED", "1", 1);
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_CHANGED", 0), 1);
  ::setenv("DMUON_TEST_CHANGED", "2", 1);
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_CHANGED", 0), 2);
  ::unsetenv("DMUON_TEST_CHANGED");
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_CHANGED", 0), 0);
}

TEST(Env, KnobSeesEachChange) {
  ::setenv("DMUON_CUDA_GRAPHS", "1", 1);
  EXPECT_TRUE(dmuon::env::kCudaGraphs.get());
  ::setenv("DMUON_CUDA_GRAPHS", "0", 1);
  EXPECT_FALSE(dmuon::env::kCudaGraphs.get());
  ::unsetenv("DMUON_CUDA_GRAPHS");
  EXPECT_TRUE(dmuon::env::kCudaGraphs.get());  // the fallback
  EXPECT_FALSE(dmuon::env::kCudaGraphs.get_if_set().has_value());
}

// An explicit option wins over the variable; the variable only replaces an unset option.
TEST(Env, ResolveGivesTheExplicitOptionPrecedence) {
  ::setenv("DMUON_PIPELINE_DEPTH", "3", 1);
  EXPECT_EQ(dmuon::env::resolve(std::optional<int64_t>(5), dmuon::env::kPipelineDepth), 5);
  EXPECT_EQ(dmuon::env::resolve(std::optional<int64_t>(), dmuon::env::kPipelineDepth), 3);
  ::unsetenv("DMUON_PIPELINE_DEPTH");
  EXPECT_EQ(dmuon::env::resolve(std::optional<int64_t>(), dmuon::env::kPipelineDepth), 0);
}

TEST(Env, ListsEveryKnobOnceWithItsKind) {
  const auto knobs = dmuon::env::all_knobs();
  EXPECT_EQ(knobs.size(), 14u);
  std::set<std::string> names;
  int overrides = 0;
  for (const auto& k : knobs) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name << " listed twice";
    EXPECT_EQ(k.name.rfind("DMUON_", 0), 0u) << k.name;
    EXPECT_FALSE(k.what.empty()) << k.name;
    overrides += k.kind == "override";
  }
  EXPECT_EQ(overrides, 4);  // the code-path switches (each also an Execution field)
  ::setenv("DMUON_NS_BATCH_MB", "7", 1);
  for (const auto& k : dmuon::env::all_knobs())
    if (k.name == "DMUON_NS_BATCH_MB") EXPECT_EQ(k.value, "7");
  ::unsetenv("DMUON_NS_BATCH_MB");
}

}  // namespace
