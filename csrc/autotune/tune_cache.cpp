// dmuon/autotune/tune_cache.cpp — text format, validation and atomic writes of the
// autotuning cache.
#include "autotune/tune_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/env.h"

namespace dmuon::autotune {
namespace {

constexpr const char* kMagic = "dmuon-autotune 1";

// Warnings: one per path and process.
std::mutex& warn_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<std::string>& warned_paths() {
  static std::set<std::string> paths;
  return paths;
}
std::function<void(const std::string&)>& warning_sink() {
  static std::function<void(const std::string&)> sink = [](const std::string& message) {
    std::cerr << "dmuon: warning: " << message << std::endl;
  };
  return sink;
}
void warn_once(const std::string& path, const std::string& message) {
  std::function<void(const std::string&)> sink;
  {
    std::lock_guard<std::mutex> lock(warn_mutex());
    if (!warned_paths().insert(path).second) return;
    sink = warning_sink();
  }
  if (sink) sink(message);
}

// FNV-1a 64 over the body: detects truncation and edits.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// NOTE: fields are tab-separated and lines newline-terminated, so neither may appear
// inside a field; they are replaced rather than escaped (names are ours, never user data).
std::string clean(std::string text) {
  for (char& c : text)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return text;
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, sep)) fields.push_back(field);
  if (!line.empty() && line.back() == sep) fields.emplace_back();
  return fields;
}

bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_double(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

std::string read_file(const std::string& path, bool* exists) {
  std::ifstream in(path, std::ios::binary);
  *exists = static_cast<bool>(in);
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void make_parent_dirs(const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1))
    ::mkdir(path.substr(0, pos).c_str(), 0755);  // NOTE: EEXIST and races are fine
}

}  // namespace

std::string TuneEnvironment::describe() const {
  return clean("gpu " + gpu_name + " | driver " + driver + " | cuda " + cuda_runtime + " | dmuon " +
               dmuon_version);
}

std::string TuneKey::str() const {
  std::ostringstream out;
  out << clean(op) << '\t' << m << '\t' << n << '\t' << k << '\t' << batch << '\t' << clean(dtype)
      << '\t' << clean(extra);
  return out.str();
}

std::optional<TuneEntry> TuneCache::get(const TuneKey& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key.str());
  if (it == entries_.end()) return std::nullopt;
  return it->second.second;
}

void TuneCache::put(const TuneKey& key, const TuneEntry& entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[key.str()] = {key, TuneEntry{clean(entry.config), entry.time_ms}};
}

size_t TuneCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::string format_cache_text(const std::map<std::string, std::pair<TuneKey, TuneEntry>>& entries,
                              const TuneEnvironment& environment) {
  std::ostringstream body;
  body << kMagic << '\n' << "env\t" << environment.describe() << '\n';
  body.precision(9);
  for (const auto& [text, value] : entries)
    body << "entry\t" << text << '\t' << value.second.config << '\t' << value.second.time_ms << '\n';
  const std::string head = body.str();
  std::ostringstream out;
  out << head << "end\t" << entries.size() << '\t' << std::hex << fnv1a(head) << '\n';
  return out.str();
}

std::optional<std::map<std::string, std::pair<TuneKey, TuneEntry>>> parse_cache_text(
    const std::string& text, const TuneEnvironment& environment, std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::nullopt;
  };
  // The trailer: "end\t<count>\t<hash of everything before it>".
  if (text.empty() || text.back() != '\n') return fail("truncated (no final newline)");
  const size_t trailer = text.rfind("end\t");
  if (trailer == std::string::npos || (trailer > 0 && text[trailer - 1] != '\n'))
    return fail("truncated (no end line)");
  const std::string head = text.substr(0, trailer);
  const auto end_fields = split(text.substr(trailer, text.size() - trailer - 1), '\t');
  int64_t count = 0;
  if (end_fields.size() != 3 || !parse_int(end_fields[1], &count)) return fail("malformed end line");
  std::ostringstream hash;
  hash << std::hex << fnv1a(head);
  if (hash.str() != end_fields[2]) return fail("checksum mismatch (corrupt or edited)");

  std::istringstream in(head);
  std::string line;
  if (!std::getline(in, line) || line != kMagic) return fail("not a dmuon autotune file");
  if (!std::getline(in, line) || line.rfind("env\t", 0) != 0) return fail("missing environment line");
  if (line.substr(4) != environment.describe())
    return fail("written for another environment (" + line.substr(4) + "), this is " +
                environment.describe());
  std::map<std::string, std::pair<TuneKey, TuneEntry>> entries;
  while (std::getline(in, line)) {
    const auto f = split(line, '\t');
    // entry op m n k batch dtype extra config time
    if (f.size() != 10 || f[0] != "entry") return fail("malformed entry line");
    TuneKey key;
    TuneEntry entry;
    key.op = f[1];
    if (!parse_int(f[2], &key.m) || !parse_int(f[3], &key.n) || !parse_int(f[4], &key.k) ||
        !parse_int(f[5], &key.batch) || !parse_double(f[9], &entry.time_ms))
      return fail("malformed number in an entry");
    key.dtype = f[6];
    key.extra = f[7];
    entry.config = f[8];
    entries[key.str()] = {key, entry};
  }
  if (static_cast<int64_t>(entries.size()) != count) return fail("entry count mismatch");
  return entries;
}

bool TuneCache::load(const std::string& path) {
  // NOTE: only a regular file is read (a FIFO at the path would block the open forever).
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    warn_once(path, "ignoring the autotune cache " + path + ": " +
                        (S_ISDIR(info.st_mode) ? "a directory" : "not a regular file") + " is at that path");
    return false;
  }
  bool exists = false;
  const std::string text = read_file(path, &exists);
  if (!exists) return true;
  std::string why;
  auto parsed = parse_cache_text(text, environment_, &why);
  if (!parsed) {
    warn_once(path, "ignoring the autotune cache " + path + ": " + why +
                        "; it will be re-measured and rewritten");
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [text_key, value] : *parsed) entries_.emplace(text_key, value);  // memory wins
  return true;
}

void TuneCache::save(const std::string& path) const {
  DMUON_CHECK(!path.empty(), "autotune cache: empty path");
  make_parent_dirs(path);
  // NOTE: an advisory lock on a sidecar file serializes read-merge-write among writers
  // (several ranks saving at once would otherwise drop each other's new entries); the
  // rename keeps readers, which take no lock, from ever seeing a torn file.
  const std::string lock_path = path + ".lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  if (lock_fd >= 0) ::flock(lock_fd, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() {
      if (fd >= 0) {
        ::flock(fd, LOCK_UN);
        ::close(fd);
      }
    }
  } unlock{lock_fd};
  // Merge what another process may have written since we loaded (valid files only).
  std::map<std::string, std::pair<TuneKey, TuneEntry>> merged;
  {
    bool exists = false;
    const std::string text = read_file(path, &exists);
    if (exists) {
      auto parsed = parse_cache_text(text, environment_, nullptr);
      if (parsed) merged = std::move(*parsed);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [text_key, value] : entries_) merged[text_key] = value;
  }
  const std::string text = format_cache_text(merged, environment_);

  // tmp (pid- and call-unique) → fsync → rename over the path.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000) +
                          "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DMUON_CHECK(fd >= 0, "autotune cache: cannot write ", path, " (creating ", tmp, "): ", std::strerror(errno));
  const auto fail = [&](const char* what) {
    const int code = errno;
    ::unlink(tmp.c_str());
    DMUON_FAIL("autotune cache: cannot write ", path, " (", what, " ", tmp, "): ", std::strerror(code));
  };
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int code = n == 0 ? ENOSPC : errno;
      ::close(fd);
      errno = code;
      fail("writing");
    }
    written += static_cast<size_t>(n);
  }
  // NOTE: fsync before rename so that a crash never leaves a truncated file under `path`;
  // a full disk may only tell at fsync or close (delayed allocation, network filesystems),
  // and a file that was not wholly written never replaces the one at `path`.
  if (::fsync(fd) != 0) {
    const int code = errno;
    ::close(fd);
    errno = code;
    fail("syncing");
  }
  if (::close(fd) != 0) fail("closing");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming");
}

void TuneCache::save_or_warn(const std::string& path) const {
  try {
    save(path);
  } catch (const Error& error) {
    // NOTE: keyed apart from the load's warning of the same path.
    warn_once("save " + path, std::string("cannot write the cache: ") + error.what());
  }
}

void TuneCache::set_warning_sink(std::function<void(const std::string&)> sink) {
  std::lock_guard<std::mutex> lock(warn_mutex());
  warning_sink() = std::move(sink);
}

std::string default_cache_path() {
  const std::string configured = env::kAutotuneCache.get();
  if (configured == "none" || configured == "0") return {};
  if (!configured.empty()) return configured;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/dmuon/autotune.txt";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/dmuon/autotune.txt";
  return {};
}

void reset_warnings_for_testing() {
  std::lock_guard<std::mutex> lock(warn_mutex());
  warned_paths().clear();
}

}  // namespace dmuon::autotune
