// dmuon/plan/hash.h — FNV-1a 64-bit hashing of plan inputs (reproducible across runs,
// processes and machines of the same endianness).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace dmuon::plan {

/// Incremental FNV-1a 64 over typed values.
class Hasher {
 public:
  void bytes(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) {
      state_ ^= p[i];
      state_ *= kPrime;
    }
  }
  void i64(int64_t value) { bytes(&value, sizeof(value)); }
  // NOTE: doubles are hashed by their bit pattern so a plan is reused only for exactly
  // the same costs.
  void f64(double value) { bytes(&value, sizeof(value)); }
  void str(const std::string& text) {
    i64(static_cast<int64_t>(text.size()));
    bytes(text.data(), text.size());
  }
  uint64_t digest() const { return state_; }

 private:
  static constexpr uint64_t kOffset = 1469598103934665603ull;
  static constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t state_ = kOffset;
};

}  // namespace dmuon::plan
