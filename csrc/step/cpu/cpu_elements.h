// dmuon/step/cpu/cpu_elements.h — the four floating-point element types of the CPU ops:
// host conversions of bfloat16 and float16 (round to nearest even, NaN kept NaN) and the
// dispatch from a DType to its element type.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/check.h"
#include "step/types.h"

namespace dmuon::step::cpu {

/// 16-bit element types as bit patterns.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint32_t bits_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float to_float(bf16_t v) { return float_from_bits(static_cast<uint32_t>(v.bits) << 16); }
inline bf16_t to_bf16(float f) {
  const uint32_t u = bits_from_float(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  // NOTE: adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even.
  return {static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

inline float to_float(f16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  const uint32_t exponent = (v.bits >> 10) & 0x1fu, mantissa = v.bits & 0x3ffu;
  if (exponent == 0x1fu) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));  // Inf, NaN
  if (exponent == 0) {  // zero and subnormals: mantissa · 2^−24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  return float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
inline f16_t to_f16(float f) {
  const uint32_t x = bits_from_float(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u))};
  // NOTE: 65520 and above round to Inf (65504 is the largest half).
  if (ax >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};
  if (ax < 0x38800000u) {  // below 2^−14: a subnormal half (or zero), value · 2^24 rounded to even
    const float scaled = float_from_bits(ax) * 16777216.0f;  // NOTE: exact (a power of two)
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  uint32_t half = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu);
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // NOTE: a carry rounds into the exponent
  return {static_cast<uint16_t>(sign | half)};
}

/// Conversions between an element type T and the arithmetic type C (float or double).
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  using Compute = float;
  static float load(float v) { return v; }
  template <typename C>
  static float store(C c) { return static_cast<float>(c); }
};
template <>
struct Elem<double> {
  using Compute = double;
  static double load(double v) { return v; }
  template <typename C>
  static double store(C c) { return static_cast<double>(c); }
};
template <>
struct Elem<bf16_t> {
  using Compute = float;
  static float load(bf16_t v) { return to_float(v); }
  template <typename C>
  static bf16_t store(C c) { return to_bf16(static_cast<float>(c)); }
};
template <>
struct Elem<f16_t> {
  using Compute = float;
  static float load(f16_t v) { return to_float(v); }
  template <typename C>
  static f16_t store(C c) { return to_f16(static_cast<float>(c)); }
};

/// c rounded to T and back (how a value held in a T tensor reads).
template <typename T, typename C>
C round_to(C c) {
  return static_cast<C>(Elem<T>::load(Elem<T>::template store<C>(c)));
}

/// fn(T{}) with T the element type of a floating-point `dtype`.
template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(float{}); return;
    case DType::kFloat64: fn(double{}); return;
    case DType::kBFloat16: fn(bf16_t{}); return;
    case DType::kFloat16: fn(f16_t{}); return;
    case DType::kInt32: break;
  }
  DMUON_FAIL("expected a floating-point dtype, got ", dtype_name(dtype));
}

/// fn(C{}) with C the arithmetic type (float or double) of an NS iterate `dtype`.
template <typename Fn>
void dispatch_compute(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat32) return fn(float{});
  if (dtype == DType::kFloat64) return fn(double{});
  DMUON_FAIL("a CPU iterate is float32 or float64, got ", dtype_name(dtype));
}

}  // namespace dmuon::step::cpu
