// dmuon/layout/shard_layout.h — where the rows of each Muon parameter live across ranks.
//
// Every Muon parameter is viewed as a 2-D "flat" matrix [flat_rows, cols]:
//   one matrix (batch_dims = 0):   [d0, d1·d2·…]            rows_per_dim0 = 1
//   a stack (batch_dims = 1):      [d0·d1, d2·…] = E × [m, n] rows_per_dim0 = d1
//   row blocks (batch_dims = 0):   [d0, d1·…] cut into blocks of rows (e.g. a fused q, k, v
//                                  projection), each block orthogonalized as its own matrix
//   column blocks (batch_dims = 0, 2-D): [d0, k·d] cut into k equal blocks of d columns
//                                  (o_proj per head), each a d0×d matrix of its own
// The matrices Muon orthogonalizes are ranges of flat rows (matrix_blocks()), all the
// columns of each but for column blocks (every block spans every row).
// Sharded on dim 0 (DTensor Shard(0), FSDP2), rank r holds a contiguous block of dim 0 —
// torch.chunk's split, trailing ranks possibly empty — hence a contiguous block of flat
// rows. Replicated, every rank holds every row. Placed on a device mesh (`mesh`: any
// DTensor placements, layout/placement.h), rank r holds a box of the tensor: a range of
// rows and a range of columns of each matrix (rank_boxes()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "layout/placement.h"

namespace dmuon::layout {

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
  /// Rows of each block orthogonalized on its own, in order, summing to a matrix's rows: dim 0
  /// of one matrix, dim 1 of every matrix of a stack (a fused gate/up expert stack); empty:
  /// every matrix is one block.
  std::vector<int64_t> row_blocks;
  /// Each matrix is stored transposed, (in, out) (HF Conv1D): the lr adjustment takes the
  /// matrix as (cols, rows). Newton–Schulz needs no change: orth(Xᵀ) = orth(X)ᵀ.
  bool transposed = false;
  /// batch_dims = 0, no row blocks, 2-D only: the number of equal column blocks, block j
  /// the columns [j·d, (j+1)·d) with d = cols / col_blocks, each orthogonalized (and
  /// lr-adjusted) as a rows×d matrix of its own (0 or 1: none).
  int64_t col_blocks = 0;
  /// Set: the placement on a device mesh gives every rank's box (rank_boxes()); `sharded`
  /// then only says whether any mesh dim shards it.
  std::optional<MeshPlacement> mesh;

  /// Throws dmuon::Error naming `what` when the shape cannot be a Muon parameter.
  void validate(const char* what) const;
  int64_t rows_per_dim0() const;
  int64_t flat_rows() const;
  int64_t cols() const;
  int64_t num_matrices() const;   ///< E (times the row blocks) for a stack, the row or column blocks, else 1
  int64_t matrix_rows() const;    ///< rows of the first matrix (of every matrix when uniform())
  int64_t matrix_cols() const;    ///< columns of every matrix (cols() / col_blocks for column blocks)
  bool splits_cols() const { return col_blocks > 1; }
  /// Flat rows of every matrix Muon orthogonalizes, in order (all rows, once per column
  /// block, for column blocks).
  std::vector<RowBlock> matrix_blocks() const;
  /// Whether every matrix has the same rows (a stack, one matrix, equal row blocks).
  bool uniform() const;
  /// (rows, cols) of a matrix of `rows` flat rows as the model uses it (the lr adjustment's m, n).
  std::pair<int64_t, int64_t> update_shape(int64_t rows) const {
    return transposed ? std::pair<int64_t, int64_t>{matrix_cols(), rows}
                      : std::pair<int64_t, int64_t>{rows, matrix_cols()};
  }
  int64_t numel() const { return flat_rows() * cols(); }
  /// Flat rows each rank holds (sharded: its chunk; replicated: all rows). Throws for a
  /// mesh placement (whose boxes need not be row ranges: rank_boxes()).
  std::vector<RowBlock> rank_rows(int world_size) const;
  /// The box each rank holds: a mesh placement's (world_size must be its group's), else
  /// the chunk of dim 0 (sharded) or the whole tensor (replicated).
  std::vector<Box> rank_boxes(int world_size, const std::string& what) const;
};

}  // namespace dmuon::layout
