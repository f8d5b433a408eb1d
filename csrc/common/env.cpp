// dmuon/common/env.cpp — parsing of DMUON_* environment knobs (read at every call).
#include "common/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "common/check.h"

namespace dmuon::env {
namespace {

// Raw value of a variable now; empty when unset.
std::string raw_value(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// A fallback as text, for the list of knobs.
std::string text_of(bool value) { return value ? "1" : "0"; }
std::string text_of(int64_t value) { return std::to_string(value); }
std::string text_of(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}
std::string text_of(const char* value) { return value; }

template <class T>
const char* type_name();
template <>
const char* type_name<bool>() { return "bool"; }
template <>
const char* type_name<int64_t>() { return "int"; }
template <>
const char* type_name<double>() { return "float"; }
template <>
const char* type_name<const char*>() { return "str"; }

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

bool is_set(const char* name) { return !raw_value(name).empty(); }

const char* kind_name(KnobKind kind) {
  switch (kind) {
    case KnobKind::kCache: return "cache";
    case KnobKind::kDiagnostic: return "diagnostic";
    case KnobKind::kOverride: return "override";
  }
  return "unknown";
}

std::vector<KnobInfo> all_knobs() {
  std::vector<KnobInfo> out;
#define DMUON_LIST_KNOB(id, type, variable, fallback, kind, what)                                          \
  out.push_back({variable, type_name<type>(), text_of(static_cast<type>(fallback)), kind_name(KnobKind::kind), \
                 what, raw_value(variable)});
  DMUON_ENV_KNOBS(DMUON_LIST_KNOB)
#undef DMUON_LIST_KNOB
  return out;
}

}  // namespace dmuon::env
