// dmuon/step/synthetic.h — the fake world's synthetic received data (DeviceOps::
// fill_synthetic): element i of a buffer filled under `seed` is a function of both only,
// the same on the CPU and on CUDA.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace dmuon::step {

/// SplitMix64's finalizer of seed ⊕ i·golden ratio: 64 well-mixed bits per index.
DMUON_HOST_DEVICE uint64_t synthetic_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Uniform on [−√3, √3) (mean 0, variance 1), 24 bits of resolution.
DMUON_HOST_DEVICE float synthetic_value(uint64_t seed, uint64_t i) {
  const float unit = static_cast<float>(synthetic_bits(seed, i) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * unit - 1.0f) * 1.7320508f;
}

}  // namespace dmuon::step
