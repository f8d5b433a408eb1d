// dmuon/common/env.cpp — parsing and caching of DMUON_* environment knobs.
#include "common/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "common/check.h"

namespace dmuon::env {
namespace {

// Cache of raw values, keyed by variable name; guarded because ranks may use threads.
std::mutex& cache_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<std::string, std::string>& raw_cache() {
  static std::unordered_map<std::string, std::string> cache;
  return cache;
}

// Raw value of a variable, read once; empty when unset.
std::string raw_value(const char* name) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = raw_cache().find(name);
  if (it != raw_cache().end()) return it->second;
  const char* value = std::getenv(name);
  std::string text = value == nullptr ? std::string() : std::string(value);
  raw_cache().emplace(name, text);
  return text;
}

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

int64_t get_int(const char* name, int64_t default_value) {
  const std::string text = raw_value(name);
  if (text.empty()) return default_value;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  DMUON_CHECK(errno == 0 && end != nullptr && *end == '\0',
              "environment variable ", name, "='", text, "' is not an integer");
  return static_cast<int64_t>(value);
}

bool get_bool(const char* name, bool default_value) {
  const std::string text = lowercase(raw_value(name));
  if (text.empty()) return default_value;
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  DMUON_FAIL("environment variable ", name, "='", text,
             "' is not a boolean (use 1/0, true/false, yes/no, on/off)");
}

double get_double(const char* name, double default_value) {
  const std::string text = raw_value(name);
  if (text.empty()) return default_value;
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  DMUON_CHECK(errno == 0 && end != nullptr && *end == '\0',
              "environment variable ", name, "='", text, "' is not a number");
  return value;
}

std::string get_string(const char* name, const std::string& default_value) {
  const std::string text = raw_value(name);
  return text.empty() ? default_value : text;
}

void clear_cache_for_testing() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  raw_cache().clear();
}

}  // namespace dmuon::env
