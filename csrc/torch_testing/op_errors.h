// dmuon/torch_testing/op_errors.h — the errors of dmuon's test and bench ops, as torch's.
#pragma once

#include <c10/util/Exception.h>

#include "common/check.h"

namespace dmuon::torch_adapter {

// NOTE: dmuon::Error is not a c10::Error; rethrowing as one keeps the message and gives
// Python a RuntimeError through the dispatcher.
template <typename F>
auto translate_errors(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace dmuon::torch_adapter
