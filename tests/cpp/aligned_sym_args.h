// tests/cpp/aligned_sym_args.h — operands of a symmetric product that every configuration's
// alignment rules accept, for the host-side tests of the kernel's and the tuner's rules
// (nothing is read or written through them).
#pragma once

#include <cstdint>

#include "ns/cuda/sym_product_args.h"

namespace dmuon::testing {

/// batch × m×m results of m×k operands, all at one 256-byte aligned address, leading
/// dimension `ld` (a multiple of 8) and batch stride m·ld.
inline ns::cuda::SymProductArgs aligned_sym_args(int64_t batch, int64_t m, int64_t k, int64_t ld) {
  alignas(256) static char buffer[256];
  ns::cuda::SymProductArgs args;
  args.batch = batch, args.m = m, args.k = k;
  args.a = args.b = args.c = args.d = buffer;
  args.lda = args.ldb = args.ldc = args.ldd = ld;
  args.stride_a = args.stride_b = args.stride_c = args.stride_d = m * ld;
  return args;
}

}  // namespace dmuon::testing
