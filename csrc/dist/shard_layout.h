// dmuon/dist/shard_layout.h — where the rows of each Muon parameter live across ranks.
//
// Every Muon parameter is viewed as a 2-D "flat" matrix [flat_rows, cols]:
//   one matrix (batch_dims = 0):   [d0, d1·d2·…]            rows_per_dim0 = 1
//   a stack (batch_dims = 1):      [d0·d1, d2·…] = E × [m, n] rows_per_dim0 = d1
// Sharded on dim 0 (DTensor Shard(0), FSDP2), rank r holds a contiguous block of dim 0 —
// torch.chunk's split, trailing ranks possibly empty — hence a contiguous block of flat
// rows. Replicated, every rank holds every row.
#pragma once

#include <cstdint>
#include <vector>

namespace dmuon::dist {

/// A contiguous range of rows [begin, begin + count).
struct RowBlock {
  int64_t begin = 0;
  int64_t count = 0;
  bool operator==(const RowBlock& other) const {
    return begin == other.begin && count == other.count;
  }
};

/// Rank r's block of [0, dim0) under torch.chunk(dim0, world) (DTensor Shard(0)).
std::vector<RowBlock> chunk_rows(int64_t dim0, int world_size);

/// Global layout of one Muon parameter.
struct ParamLayout {
  std::vector<int64_t> global_shape;
  int64_t batch_dims = 0;  ///< 1: a stack of matrices [E, m, n…]; 0: one matrix
  bool sharded = false;    ///< Shard(0) over the group; otherwise replicated on every rank

  /// Throws dmuon::Error naming `what` when the shape cannot be a Muon parameter.
  void validate(const char* what) const;
  int64_t rows_per_dim0() const;
  int64_t flat_rows() const;
  int64_t cols() const;
  int64_t num_matrices() const;   ///< E for a stack, else 1
  int64_t matrix_rows() const;    ///< m of each matrix
  int64_t numel() const { return flat_rows() * cols(); }
  /// Flat rows each rank holds (sharded: its chunk; replicated: all rows).
  std::vector<RowBlock> rank_rows(int world_size) const;
};

}  // namespace dmuon::dist
