// dmuon/ns/cuda/sm90_sym_units.h — the work units of the "n256" variant of the sm_90a
// symmetric kernel: 128×256 units over the lower-triangle 128×128 tiles of one matrix
// (host and device code, no CUDA headers needed, so the decoding is unit-tested on the
// CPU: tests/cpp/test_sym_units.cpp).
//
// R = row tiles of one matrix. A unit is row tile i × column block b, 2b ≤ i: column tiles
// 2b and 2b + 1. Row i holds ⌊i/2⌋ + 1 units, numbered row by row. The unit (i, i/2) of an
// even row has its second tile, (i, i + 1), above the diagonal: computed, never written
// (its values are those of (i + 1, i), which another unit writes with its mirror).
// NOTE: rows 0..2q−1 hold q(q + 1) units and rows 0..2q hold (q + 1)²; hence, with
// s = ⌊√u⌋, unit u lies in row 2s − 1 when u < s² + s and in row 2s otherwise.
#pragma once

#include <cmath>
#include <cstdint>

#include "ns/cuda/sm90_sym_pairs.h"  // DMUON_HOST_DEVICE

namespace dmuon::ns::cuda {

/// Units of one matrix with `num_row_tiles` row tiles.
DMUON_HOST_DEVICE int64_t wide_units(int64_t num_row_tiles) {
  const int64_t q = num_row_tiles / 2;
  return num_row_tiles % 2 ? (q + 1) * (q + 1) : q * (q + 1);
}

/// Unit u of a matrix → its row tile i and column block b (column tiles 2b, 2b + 1).
DMUON_HOST_DEVICE void decode_wide(int64_t u, int& i, int& b) {
  int64_t s = static_cast<int64_t>(std::sqrt(static_cast<double>(u)));
  while (s * s > u) --s;  // NOTE: the rounding of the square root, either way
  while ((s + 1) * (s + 1) <= u) ++s;
  if (u < s * s + s) {
    i = static_cast<int>(2 * s - 1);
    b = static_cast<int>(u - s * s);
  } else {
    i = static_cast<int>(2 * s);
    b = static_cast<int>(u - s * s - s);
  }
}

}  // namespace dmuon::ns::cuda
