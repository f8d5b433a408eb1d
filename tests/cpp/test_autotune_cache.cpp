// Tests of the on-disk autotune cache: round trip, corrupt / truncated / stale files
// ignored with one warning and rebuilt, concurrent writers never leave a torn file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autotune/tune_cache.h"
#include "common/check.h"

namespace dmuon::autotune {
namespace {

TuneEnvironment env_a() { return {"NVIDIA H200", "13000", "13000", "0.1.0"}; }

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/dmuon_autotune_test_" + std::to_string(::getpid()) + "_" + name;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Collects warnings for one test.
struct Warnings {
  std::vector<std::string> seen;
  Warnings() {
    reset_warnings_for_testing();
    TuneCache::set_warning_sink([this](const std::string& m) { seen.push_back(m); });
  }
  ~Warnings() { TuneCache::set_warning_sink(nullptr); }
};

TEST(AutotuneCache, RoundTrip) {
  Warnings warnings;
  const std::string path = temp_path("roundtrip/cache.txt");
  TuneCache cache(env_a());
  cache.put({"sym", 896, 896, 4864, 7, "float16", "beta0"}, {"kernel:staged:s5", 0.125});
  cache.put({"ns", 3584, 18944, 3584, 1, "float16", ""}, {"standard", 17.5});
  cache.save(path);
  TuneCache loaded(env_a());
  EXPECT_TRUE(loaded.load(path));
  ASSERT_EQ(loaded.size(), 2u);
  auto e = loaded.get({"sym", 896, 896, 4864, 7, "float16", "beta0"});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->config, "kernel:staged:s5");
  EXPECT_DOUBLE_EQ(e->time_ms, 0.125);
  EXPECT_FALSE(loaded.get({"sym", 896, 896, 4864, 8, "float16", "beta0"}).has_value());
  EXPECT_TRUE(warnings.seen.empty());
  std::remove(path.c_str());
}

// An unwritable file is one warning per path, never an error (save() throws instead).
TEST(AutotuneCache, UnwritableFileIsOneWarningWhenSavedOrWarned) {
  Warnings warnings;
  const std::string path = "/proc/dmuon_no_such_dir/cache.txt";
  TuneCache cache(env_a());
  cache.put({"sym", 1, 1, 1, 1, "float16", ""}, {"kernel", 1.0});
  EXPECT_THROW(cache.save(path), Error);
  cache.save_or_warn(path);
  cache.save_or_warn(path);
  ASSERT_EQ(warnings.seen.size(), 1u);
  EXPECT_NE(warnings.seen[0].find("cannot write the cache"), std::string::npos) << warnings.seen[0];
  EXPECT_NE(warnings.seen[0].find(path), std::string::npos) << warnings.seen[0];
}

TEST(AutotuneCache, MissingFileIsNotAWarning) {
  Warnings warnings;
  TuneCache cache(env_a());
  EXPECT_TRUE(cache.load(temp_path("does_not_exist.txt")));
  EXPECT_TRUE(warnings.seen.empty());
}

TEST(AutotuneCache, CorruptTruncatedAndStaleFilesIgnoredWithOneWarning) {
  const std::string path = temp_path("bad.txt");
  TuneCache good(env_a());
  good.put({"gemm", 1, 2, 3, 4, "bfloat16", ""}, {"lt:algo0", 1.0});
  good.save(path);
  const std::string text = read_all(path);

  auto write = [&](const std::string& content) {
    std::ofstream out(path, std::ios::trunc);
    out << content;
  };
  const std::vector<std::string> bad = {
      text.substr(0, text.size() / 2),                      // truncated
      std::string("garbage\x01\x02 not a cache\n"),         // foreign
      [&] { std::string t = text; t[t.find("lt:algo0")] = 'X'; return t; }(),  // edited
  };
  for (const std::string& content : bad) {
    Warnings warnings;
    write(content);
    TuneCache cache(env_a());
    EXPECT_FALSE(cache.load(path));
    EXPECT_FALSE(cache.load(path));  // second load: no second warning
    EXPECT_EQ(cache.size(), 0u);
    ASSERT_EQ(warnings.seen.size(), 1u);
    EXPECT_NE(warnings.seen[0].find(path), std::string::npos);
    // Rebuilt: saving over the bad file gives a valid one.
    cache.put({"sym", 5, 5, 5, 1, "float16", ""}, {"dense", 2.0});
    cache.save(path);
    TuneCache again(env_a());
    EXPECT_TRUE(again.load(path));
    EXPECT_EQ(again.size(), 1u);
  }

  // Stale: written for another driver / dmuon version.
  {
    Warnings warnings;
    TuneEnvironment other = env_a();
    other.dmuon_version = "0.0.9";
    TuneCache old(other);
    old.put({"sym", 7, 7, 7, 1, "float16", ""}, {"kernel", 1.0});
    old.save(path);
    TuneCache cache(env_a());
    EXPECT_FALSE(cache.load(path));
    EXPECT_EQ(cache.size(), 0u);
    ASSERT_EQ(warnings.seen.size(), 1u);
    EXPECT_NE(warnings.seen[0].find("another environment"), std::string::npos);
  }
  std::remove(path.c_str());
}

// A file cut anywhere, or with one character changed, is refused (never read as another
// table: a time cut inside its number, 5.4672999795002397e-05 → 5.4672999795002397, once
// read as a valid cost table of 5.47 s), and the cache that tried to load it keeps what
// it held.
TEST(AutotuneCache, RefusesEveryTruncationAndEveryChangedCharacter) {
  const std::string path = temp_path("cut.txt");
  TuneCache written(env_a());
  written.put({"ns_time", 8, 12, 0, 1, "float32", "gram"}, {"median", 5.4672999795002397e-02});
  written.put({"ns_time", 8, 12, 0, 2, "float32", "gram"}, {"median", 1.0e-1});
  written.save(path);
  const std::string text = read_all(path);
  for (size_t length = 0; length < text.size(); ++length) {
    std::string why;
    EXPECT_FALSE(parse_cache_text(text.substr(0, length), env_a(), &why).has_value()) << "cut to " << length;
    EXPECT_FALSE(why.empty());
  }
  for (size_t pos = 0; pos + 1 < text.size(); ++pos) {
    std::string changed = text;
    changed[pos] = changed[pos] == '1' ? '2' : '1';
    EXPECT_FALSE(parse_cache_text(changed, env_a(), nullptr).has_value()) << "changed at " << pos;
  }
  Warnings warnings;
  { std::ofstream(path, std::ios::binary) << text.substr(0, text.size() - 3); }
  TuneCache kept(env_a());
  kept.put({"sym", 1, 1, 1, 1, "float16", ""}, {"kernel", 1.0});
  EXPECT_FALSE(kept.load(path));
  EXPECT_EQ(kept.size(), 1u);
  EXPECT_EQ(warnings.seen.size(), 1u);
  std::remove(path.c_str());
}

TEST(AutotuneCache, ConcurrentWritersLeaveAValidMergedFile) {
  Warnings warnings;
  const std::string path = temp_path("concurrent.txt");
  constexpr int kWriters = 6, kRounds = 20;
  std::vector<pid_t> children;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        for (int r = 0; r < kRounds; ++r) {
          TuneCache cache(env_a());
          cache.load(path);
          cache.put({"sym", w, r, 1, 1, "float16", ""}, {"kernel", double(w * 100 + r)});
          cache.save(path);
        }
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  TuneCache cache(env_a());
  EXPECT_TRUE(cache.load(path));
  // Every entry of every writer is there (saves merge under the lock).
  EXPECT_EQ(cache.size(), static_cast<size_t>(kWriters * kRounds));
  EXPECT_TRUE(warnings.seen.empty());
  std::remove(path.c_str());
  std::remove((path + ".lock").c_str());
}

}  // namespace
}  // namespace dmuon::autotune
