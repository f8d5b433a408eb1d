// dmuon/ns/cuda/sm90_sym_pairs.h — the work list of the 2-CTA cluster ("mc2") variant of the
// sm_90a symmetric kernel: lower-triangle tiles of a batch of matrices, grouped into pairs
// of tiles that share one operand panel (host and device code, no CUDA headers needed, so
// the decoding is unit-tested on the CPU: tests/cpp/test_sym_pairs.cpp).
//
// One pair = one unit of work of one cluster (CTA rank 0 takes tile 0, rank 1 tile 1).
// R = row tiles of one matrix, L = ceil(R/2) (the columns of odd length, see below).
//   1. column pairs (kShareB): tiles (j+2q, j), (j+2q+1, j) share the B panel j. Column j
//      has R − j tiles, floor((R − j)/2) pairs; a column of odd length leaves its bottom
//      tile (R − 1, j) over. floor(R²/4) pairs per matrix.
//   2. row pairs (kShareA): the leftover bottom tiles (R − 1, j), j = R − 1, R − 3, …, all
//      lie in row R − 1 and share its A panel; consecutive ones pair up: floor(L/2) pairs.
//   3. lone tiles: when L is odd, one leftover per matrix, (R − 1, R + 1 − 2L). After all
//      matrices' pairs, the lone tiles of matrices 2w and 2w + 1 form a pair that shares
//      nothing (kSeparate); an odd batch count leaves the last one alone: both CTAs run
//      that tile (kShadow) with the B panel shared and rank 1 skips the epilogue, so the
//      ring and barrier protocol stays the same for every unit.
// NOTE: per matrix 2·floor(R²/4) + 2·floor(L/2) + (L odd) = R(R+1)/2 tiles (every tile once).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace dmuon::ns::cuda {

/// Which operand panel the two tiles of a unit share (multicast by TMA to both CTAs).
enum class PairKind : int { kShareB = 0, kShareA = 1, kSeparate = 2, kShadow = 3 };

/// Counts of the pair list for R row tiles and `batch` matrices.
struct PairList {
  int num_row_tiles = 0;         ///< R
  int64_t col_pairs = 0;         ///< floor(R²/4) per matrix
  int64_t pairs_per_matrix = 0;  ///< col_pairs + floor(L/2)
  int64_t num_units = 0;         ///< pairs_per_matrix·batch + (L odd ? ceil(batch/2) : 0)
  int batch = 0;
};

DMUON_HOST_DEVICE PairList make_pair_list(int num_row_tiles, int batch) {
  PairList list;
  const int64_t r = num_row_tiles, half = (r + 1) / 2;  // half = L
  list.num_row_tiles = num_row_tiles;
  list.batch = batch;
  list.col_pairs = r * r / 4;
  list.pairs_per_matrix = list.col_pairs + half / 2;
  list.num_units = list.pairs_per_matrix * batch + ((half & 1) ? (static_cast<int64_t>(batch) + 1) / 2 : 0);
  return list;
}

/// One CTA's tile of unit `u`: (row tile, col tile, matrix), the unit's kind, and whether this
/// CTA writes it (false only for rank 1 of a kShadow unit).
struct PairTile {
  int ti, tj, l;
  PairKind kind;
  bool writes;
};

/// Where unit u lies in a pair list (this one or sm90_sym_units.h's wide one): for a pair of
/// one matrix, its index v within that matrix's pairs (t.l set, t.writes true); for a pair of
/// lone units (matrices 2w and 2w + 1, or the last one twice), −1 with t.l, t.kind
/// (kSeparate or kShadow) and t.writes set. The caller fills in the rest.
DMUON_HOST_DEVICE int64_t locate_pair(const PairList& list, int64_t u, int rank, PairTile& t) {
  t.writes = true;
  if (u < list.pairs_per_matrix * list.batch) {
    t.l = static_cast<int>(u / list.pairs_per_matrix);
    return u % list.pairs_per_matrix;
  }
  const int64_t w = u - list.pairs_per_matrix * list.batch;
  const bool alone = 2 * w + 1 >= list.batch;
  t.l = static_cast<int>(2 * w + (alone ? 0 : rank));
  t.kind = alone ? PairKind::kShadow : PairKind::kSeparate;
  t.writes = !alone || rank == 0;
  return -1;
}

// Unit u → the tile of CTA `rank` (0 or 1). Column pairs run from the shortest column
// (j = R − 2) to the longest (j = 0): column j is the (R − j − 1)-th, and the first n columns
// counted that way (lengths 2 … n + 1) hold floor((n + 1)²/4) pairs.
DMUON_HOST_DEVICE PairTile decode_pair(const PairList& list, int64_t u, int rank) {
  const int r = list.num_row_tiles;
  PairTile t;
  const int64_t v = locate_pair(list, u, rank, t);
  if (v < 0) {
    // Lone tiles (R − 1, R + 1 − 2L).
    t.ti = r - 1;
    t.tj = r + 1 - 2 * ((r + 1) / 2);
  } else if (v < list.col_pairs) {
    // Column pair: n with floor(n²/4) ≤ v < floor((n+1)²/4) is the column of length n + 1.
    int64_t n = static_cast<int64_t>(2.0 * sqrt(static_cast<double>(v)));
    while (n > 0 && n * n / 4 > v) --n;
    while ((n + 1) * (n + 1) / 4 <= v) ++n;
    const int j = r - 1 - static_cast<int>(n);
    const int q = static_cast<int>(v - n * n / 4);
    t.ti = j + 2 * q + rank;
    t.tj = j;
    t.kind = PairKind::kShareB;
  } else {
    // Row pair: leftover bottom tiles (R − 1, R − 1 − 4w − 2·rank).
    const int w = static_cast<int>(v - list.col_pairs);
    t.ti = r - 1;
    t.tj = r - 1 - 4 * w - 2 * rank;
    t.kind = PairKind::kShareA;
  }
  return t;
}

}  // namespace dmuon::ns::cuda
