// tests/cpp/error_of.h — the message of the dmuon::Error a callable throws, for tests that
// check that errors name the argument.
#pragma once

#include <string>

#include "common/check.h"

namespace dmuon::testing {

/// The message of the dmuon::Error that `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

/// Whether `text` holds `part`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace dmuon::testing
