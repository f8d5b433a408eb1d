// dmuon/common/check.h — the one family of error macros used everywhere in the core.
//
// Every failed check throws dmuon::Error carrying "file:line: message". Callers at the
// boundary (the torch adapter, the CLI) turn it into a Python exception; nothing ever exits.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dmuon {

/// Error raised by every failed DMUON_CHECK. Its what() names the source location.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {

// Stream any number of arguments into one string (empty when none are given).
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

[[noreturn]] inline void throw_error(const char* file, int line, const std::string& what) {
  std::ostringstream out;
  out << file << ":" << line << ": " << what;
  throw Error(out.str());
}

}  // namespace detail
}  // namespace dmuon

// Check an invariant or an argument; the message arguments are streamed only on failure.
#define DMUON_CHECK(cond, ...)                                                        \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      ::dmuon::detail::throw_error(__FILE__, __LINE__,                                \
                                   ::dmuon::detail::concat(__VA_ARGS__));             \
    }                                                                                 \
  } while (0)

// Unconditional failure with a message.
#define DMUON_FAIL(...) \
  ::dmuon::detail::throw_error(__FILE__, __LINE__, ::dmuon::detail::concat(__VA_ARGS__))
