// dmuon/step/cpu/flush_denormals.h — subnormal floats read and written as zero on this
// thread while a scope runs (x86-64: MXCSR's FTZ and DAZ bits; AArch64: FPCR's FZ bit),
// the thread's previous mode restored when it ends. Elsewhere a no-op.
#pragma once

#include <cstdint>

#if defined(__SSE2__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace dmuon::step::cpu {

// NOTE: a float32 momentum entry whose gradient stays zero decays by μ each step and, from
// about step 1,500 of a tiny model (μ = 0.95), into the subnormal range, where it stays (μ·m
// rounds back to m) and every operation on it (the lerp, the NS products) takes a microcode
// assist: the CPU step went from 0.27–0.31 ms to 1.5–2.2 ms (1,376 subnormal entries by
// step 2,500); with subnormals flushed it stays flat. A subnormal (|x| < 1.18e-38 in
// float32, 2.2e-308 in float64) reads and is written as ±0, so such an entry stops where
// its decrement (1 − μ)·m would be subnormal (near 2.4e-37 at μ = 0.95).
class FlushDenormals {
 public:
  FlushDenormals() {
#if defined(__SSE2__) || defined(_M_X64)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
#elif defined(__aarch64__)
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t flushed = saved_ | kFlushToZero;
    __asm__ __volatile__("msr fpcr, %0" : : "r"(flushed));
#endif
  }
  ~FlushDenormals() {
#if defined(__SSE2__) || defined(_M_X64)
    _mm_setcsr(static_cast<unsigned>(saved_));
#elif defined(__aarch64__)
    __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
#if defined(__SSE2__) || defined(_M_X64)
  static constexpr unsigned kFlushToZero = 0x8000u, kDenormalsAreZero = 0x0040u;
  unsigned saved_ = 0;
#elif defined(__aarch64__)
  static constexpr uint64_t kFlushToZero = uint64_t{1} << 24;
  uint64_t saved_ = 0;
#endif
};

}  // namespace dmuon::step::cpu
