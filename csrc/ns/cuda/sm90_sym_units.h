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

#include "ns/cuda/sm90_sym_pairs.h"  // DMUON_HOST_DEVICE, PairList, PairTile

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

// Pairs of 128×256 units for the 2-CTA cluster ("mc2-n256") variant, in a PairList
// (sm90_sym_pairs.h; CTA rank r takes unit r of a pair, tj is then the column block b).
// P = floor(R/2).
//   1. row pairs (kShareB): rows 2q and 2q + 1 (q < P) both hold the blocks b = 0 … q; the
//      units (2q, b), (2q + 1, b) share the B panel of block b. P(P + 1)/2 pairs a matrix.
//   2. when R is odd, the last row 2P holds P + 1 units over one A panel: (2P, 2w) and
//      (2P, 2w + 1) pair up (kShareA), floor((P + 1)/2) pairs.
//   3. when P + 1 is odd too (R ≡ 1 mod 4), its last unit (2P, P) is over: the lone units of
//      matrices 2w and 2w + 1 pair up (kSeparate), an odd batch count leaves the last one
//      to both CTAs (kShadow: rank 1 writes nothing), as in sm90_sym_pairs.h.
// NOTE: per matrix P(P + 1) + (R odd ? 2·floor((P + 1)/2) + (P + 1) % 2 : 0) = wide_units(R).
DMUON_HOST_DEVICE PairList make_wide_pair_list(int num_row_tiles, int batch) {
  PairList list;
  const int64_t r = num_row_tiles, p = r / 2;
  const bool odd_row = r % 2 == 1, lone = odd_row && p % 2 == 0;
  list.num_row_tiles = num_row_tiles;
  list.batch = batch;
  list.col_pairs = p * (p + 1) / 2;
  list.pairs_per_matrix = list.col_pairs + (odd_row ? (p + 1) / 2 : 0);
  list.num_units = list.pairs_per_matrix * batch + (lone ? (static_cast<int64_t>(batch) + 1) / 2 : 0);
  return list;
}

/// Unit u of a wide pair list → the unit of CTA `rank`: ti its row tile, tj its column block.
DMUON_HOST_DEVICE PairTile decode_wide_pair(const PairList& list, int64_t u, int rank) {
  const int p = list.num_row_tiles / 2;
  PairTile t;
  const int64_t v = locate_pair(list, u, rank, t);
  if (v < 0) {
    // Lone units (2P, P).
    t.ti = 2 * p;
    t.tj = p;
  } else if (v < list.col_pairs) {
    // Rows 2q, 2q + 1: q with q(q + 1)/2 ≤ v < (q + 1)(q + 2)/2, block b = v − q(q + 1)/2.
    int64_t q = static_cast<int64_t>((std::sqrt(8.0 * static_cast<double>(v) + 1.0) - 1.0) * 0.5);
    while (q > 0 && q * (q + 1) / 2 > v) --q;
    while ((q + 1) * (q + 2) / 2 <= v) ++q;
    t.ti = static_cast<int>(2 * q + rank);
    t.tj = static_cast<int>(v - q * (q + 1) / 2);
    t.kind = PairKind::kShareB;
  } else {
    // The odd last row 2P: blocks 2w and 2w + 1.
    t.ti = 2 * p;
    t.tj = static_cast<int>(2 * (v - list.col_pairs) + rank);
    t.kind = PairKind::kShareA;
  }
  return t;
}

}  // namespace dmuon::ns::cuda
