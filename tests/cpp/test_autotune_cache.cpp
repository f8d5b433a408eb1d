// Tests of the on-disk autotune cache: round trip, corrupt / truncated / stale files
// ignored with one warning and rebuilt, concurrent writers never leave a torn file.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>

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

std::string temp_dir() {
  const char* dir = std::getenv("TMPDIR");
  return dir ? dir : "/tmp";
}

std::string temp_path(const std::string& name) {
  return temp_dir() + "/dmuon_autotune_test_" + std::to_string(::getpid()) + "_" + name;
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

// `save` into `path` in a child process after `limit` (the child's own resource limits or
// user): 0 when it threw an Error naming `path` and `reason`, 1 when it did not throw, 2
// when the error named neither. A child, so that the limits end with it.
int save_fails_in_child(const std::string& path, const std::string& reason, const std::function<void()>& limit) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    limit();
    TuneCache cache(env_a());
    cache.put({"sym", 3, 3, 3, 1, "float16", ""}, {"kernel", 3.0});
    int rc = 1;
    try {
      cache.save(path);
    } catch (const Error& error) {
      const std::string text = error.what();
      rc = text.find(path) != std::string::npos && text.find(reason) != std::string::npos ? 0 : 2;
      if (rc != 0) std::fprintf(stderr, "unexpected error: %s\n", text.c_str());
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// The one entry a valid file at `path` holds, or an empty string.
std::string only_config(const std::string& path) {
  TuneCache cache(env_a());
  if (!cache.load(path) || cache.size() != 1) return {};
  const auto entry = cache.get({"sym", 1, 1, 1, 1, "float16", ""});
  return entry ? entry->config : std::string();
}

// Names in `dir` that start with `prefix` (temporary files a failed save left).
int files_starting_with(const std::string& dir, const std::string& prefix) {
  int count = 0;
  DIR* d = ::opendir(dir.c_str());
  for (dirent* e = d ? ::readdir(d) : nullptr; e != nullptr; e = ::readdir(d))
    count += std::string(e->d_name).rfind(prefix, 0) == 0;
  if (d) ::closedir(d);
  return count;
}

// A disk that fills while the cache is written (the file-size limit: write fails with
// EFBIG after the first bytes): the save throws naming the file, the cache already at the
// path is kept whole, and no temporary file is left.
TEST(AutotuneCache, AFailedWriteKeepsThePreviousFileAndLeavesNoTemporary) {
  Warnings warnings;
  const std::string dir = temp_path("full"), path = dir + "/cache.txt";
  TuneCache before(env_a());
  before.put({"sym", 1, 1, 1, 1, "float16", ""}, {"previous", 1.0});
  before.save(path);
  EXPECT_EQ(save_fails_in_child(path, "File too large", [] {
              std::signal(SIGXFSZ, SIG_IGN);  // NOTE: else the limit kills instead of failing the write
              const rlimit small{16, 16};
              ::setrlimit(RLIMIT_FSIZE, &small);
            }), 0);
  EXPECT_EQ(only_config(path), "previous");
  EXPECT_EQ(files_starting_with(dir, "cache.txt.tmp."), 0);
  EXPECT_TRUE(warnings.seen.empty());
  std::remove(path.c_str());
  std::remove((path + ".lock").c_str());
  ::rmdir(dir.c_str());
}

// A directory or a FIFO where the cache file should be: loading it is one warning naming
// it (not a "corrupt file"; a FIFO is never opened, which would wait for a writer forever);
// saving over the directory throws naming it, save_or_warn warns once.
TEST(AutotuneCache, ADirectoryOrAFifoAtThePathIsNamedAtLoadAndSave) {
  Warnings warnings;
  const std::string fifo = temp_path("fifo"), path = temp_path("is_a_dir");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  TuneCache cache(env_a());
  EXPECT_FALSE(cache.load(fifo));
  EXPECT_FALSE(cache.load(path));
  ASSERT_EQ(warnings.seen.size(), 2u);
  EXPECT_NE(warnings.seen[0].find(fifo + ": not a regular file is at that path"), std::string::npos)
      << warnings.seen[0];
  EXPECT_NE(warnings.seen[1].find(path + ": a directory is at that path"), std::string::npos) << warnings.seen[1];
  cache.put({"sym", 1, 1, 1, 1, "float16", ""}, {"kernel", 1.0});
  const std::string error = [&] {
    try {
      cache.save(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_NE(error.find("cannot write " + path), std::string::npos) << error;
  EXPECT_NE(error.find("Is a directory"), std::string::npos) << error;
  cache.save_or_warn(path);
  cache.save_or_warn(path);
  ASSERT_EQ(warnings.seen.size(), 3u);
  EXPECT_NE(warnings.seen[2].find(path), std::string::npos) << warnings.seen[2];
  EXPECT_EQ(files_starting_with(temp_dir(), "dmuon_autotune_test_" + std::to_string(::getpid()) + "_is_a_dir.tmp"), 0);
  std::remove(fifo.c_str());
  std::remove((path + ".lock").c_str());
  ::rmdir(path.c_str());
}

// A read-only directory (entered as an unprivileged user where the test runs as root, who
// writes anywhere): the save throws naming the file and the reason; the file there is kept.
TEST(AutotuneCache, AReadOnlyDirectoryIsNamed) {
  const std::string dir = temp_path("read_only"), path = dir + "/cache.txt";
  TuneCache before(env_a());
  before.put({"sym", 1, 1, 1, 1, "float16", ""}, {"previous", 1.0});
  before.save(path);
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  EXPECT_EQ(save_fails_in_child(path, "Permission denied", [] {
              if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
            }), 0);
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(only_config(path), "previous");
  std::remove(path.c_str());
  std::remove((path + ".lock").c_str());
  ::rmdir(dir.c_str());
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
