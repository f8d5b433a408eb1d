// Typed environment knobs: defaults, parsing, and errors naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/check.h"
#include "common/env.h"

namespace {

TEST(Env, DefaultsWhenUnset) {
  ::unsetenv("DMUON_TEST_UNSET");
  dmuon::env::clear_cache_for_testing();
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_UNSET", 7), 7);
  EXPECT_TRUE(dmuon::env::get_bool("DMUON_TEST_UNSET", true));
  EXPECT_EQ(dmuon::env::get_string("DMUON_TEST_UNSET", "x"), "x");
}

TEST(Env, ParsesValues) {
  ::setenv("DMUON_TEST_INT", "-42", 1);
  ::setenv("DMUON_TEST_BOOL", "Off", 1);
  ::setenv("DMUON_TEST_DOUBLE", "2.5e-3", 1);
  dmuon::env::clear_cache_for_testing();
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_INT", 0), -42);
  EXPECT_FALSE(dmuon::env::get_bool("DMUON_TEST_BOOL", true));
  EXPECT_DOUBLE_EQ(dmuon::env::get_double("DMUON_TEST_DOUBLE", 0.0), 2.5e-3);
}

TEST(Env, MalformedValueNamesTheVariable) {
  ::setenv("DMUON_TEST_BAD", "12abc", 1);
  dmuon::env::clear_cache_for_testing();
  try {
    dmuon::env::get_int("DMUON_TEST_BAD", 0);
    FAIL() << "expected an error";
  } catch (const dmuon::Error& e) {
    EXPECT_NE(std::string(e.what()).find("DMUON_TEST_BAD"), std::string::npos);
  }
  EXPECT_THROW(dmuon::env::get_bool("DMUON_TEST_BAD", false), dmuon::Error);
}

TEST(Env, CachedAfterFirstRead) {
  ::setenv("DMUON_TEST_CACHED", "1", 1);
  dmuon::env::clear_cache_for_testing();
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_CACHED", 0), 1);
  ::setenv("DMUON_TEST_CACHED", "2", 1);
  EXPECT_EQ(dmuon::env::get_int("DMUON_TEST_CACHED", 0), 1);
}

}  // namespace
