// dmuon/layout/shard_layout.cpp — row blocks of sharded and replicated parameters.
#include "layout/shard_layout.h"

#include <algorithm>

#include "common/check.h"

namespace dmuon::layout {

std::vector<RowBlock> chunk_rows(int64_t dim0, int world_size) {
  DMUON_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  DMUON_CHECK(dim0 >= 0, "dim 0 must be >= 0, got ", dim0);
  // torch.chunk: chunks of ceil(dim0 / world), the last ones shorter or empty.
  const int64_t chunk = (dim0 + world_size - 1) / world_size;
  std::vector<RowBlock> blocks(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const int64_t begin = std::min<int64_t>(dim0, r * chunk);
    const int64_t end = std::min<int64_t>(dim0, begin + chunk);
    blocks[static_cast<size_t>(r)] = {begin, end - begin};
  }
  return blocks;
}

void ParamLayout::validate(const char* what) const {
  DMUON_CHECK(batch_dims == 0 || batch_dims == 1, what, ": batch_dims must be 0 or 1, got ",
              batch_dims);
  DMUON_CHECK(static_cast<int64_t>(global_shape.size()) >= 2 + batch_dims, what,
              ": a Muon parameter needs at least ", 2 + batch_dims, " dims, got ",
              global_shape.size());
  for (int64_t d : global_shape) DMUON_CHECK(d >= 0, what, ": negative dimension ", d);
  DMUON_CHECK(col_blocks >= 0, what, ": col_blocks must be >= 0, got ", col_blocks);
  if (splits_cols()) {
    DMUON_CHECK(batch_dims == 0 && global_shape.size() == 2 && row_blocks.empty(), what, ": ", col_blocks,
                " column blocks need one 2-D matrix without row blocks (batch_dims 0), got a ", global_shape.size(),
                "-D shape with batch_dims ", batch_dims, " and ", row_blocks.size(), " row blocks");
    DMUON_CHECK(global_shape[1] % col_blocks == 0, what, ": ", global_shape[1], " columns are not divisible into ",
                col_blocks, " column blocks");
  }
  if (row_blocks.empty()) return;
  int64_t total = 0;
  for (int64_t rows : row_blocks) {
    DMUON_CHECK(rows > 0, what, ": every row block needs at least one row, got ", rows);
    total += rows;
  }
  // One matrix: blocks of dim 0; a stack: the same blocks of every matrix's rows (dim 1).
  const int64_t rows = global_shape[static_cast<size_t>(batch_dims)];
  DMUON_CHECK(total == rows, what, ": row blocks sum to ", total, " rows but dim ", batch_dims, " has ", rows);
}

int64_t ParamLayout::rows_per_dim0() const { return batch_dims == 1 ? global_shape[1] : 1; }

int64_t ParamLayout::flat_rows() const { return global_shape[0] * rows_per_dim0(); }

int64_t ParamLayout::cols() const {
  int64_t cols = 1;
  for (size_t d = 1 + static_cast<size_t>(batch_dims); d < global_shape.size(); ++d) cols *= global_shape[d];
  return cols;
}

int64_t ParamLayout::num_matrices() const {
  if (splits_cols()) return col_blocks;
  const int64_t blocks = row_blocks.empty() ? 1 : static_cast<int64_t>(row_blocks.size());
  return batch_dims == 1 ? global_shape[0] * blocks : blocks;
}

int64_t ParamLayout::matrix_rows() const {
  if (!row_blocks.empty()) return row_blocks.front();
  return global_shape[static_cast<size_t>(batch_dims)];
}

int64_t ParamLayout::matrix_cols() const { return splits_cols() ? cols() / col_blocks : cols(); }

std::vector<RowBlock> ParamLayout::matrix_blocks() const {
  std::vector<RowBlock> blocks;
  if (splits_cols()) {
    blocks.assign(static_cast<size_t>(col_blocks), {0, global_shape[0]});
    return blocks;
  }
  // Every matrix of a stack (one for batch_dims 0), each cut into its row blocks.
  const int64_t rows = global_shape[static_cast<size_t>(batch_dims)];
  const int64_t num_stacked = batch_dims == 1 ? global_shape[0] : 1;
  for (int64_t e = 0; e < num_stacked; ++e) {
    if (row_blocks.empty()) {
      blocks.push_back({e * rows, rows});
      continue;
    }
    int64_t begin = e * rows;
    for (int64_t count : row_blocks) {
      blocks.push_back({begin, count});
      begin += count;
    }
  }
  return blocks;
}

bool ParamLayout::uniform() const {
  return std::all_of(row_blocks.begin(), row_blocks.end(), [&](int64_t rows) { return rows == row_blocks.front(); });
}

std::vector<RowBlock> ParamLayout::rank_rows(int world_size) const {
  DMUON_CHECK(!mesh, "a parameter placed ", mesh->describe(), " holds boxes, not row ranges (rank_boxes)");
  if (!sharded) return std::vector<RowBlock>(static_cast<size_t>(world_size), {0, flat_rows()});
  std::vector<RowBlock> blocks = chunk_rows(global_shape[0], world_size);
  for (RowBlock& b : blocks) {
    b.begin *= rows_per_dim0();
    b.count *= rows_per_dim0();
  }
  return blocks;
}

}  // namespace dmuon::layout

namespace dmuon::layout {

std::vector<Box> ParamLayout::rank_boxes(int world_size, const std::string& what) const {
  if (mesh) {
    DMUON_CHECK(mesh->world_size() == world_size, what, ": placements ", mesh->describe(), " list ",
                mesh->world_size(), " ranks, but the group has ", world_size);
    return layout::rank_boxes(global_shape, *mesh, what);
  }
  std::vector<Box> boxes;
  Box whole;
  for (int64_t d : global_shape) whole.push_back({0, d});
  const std::vector<RowBlock> dim0 = sharded ? chunk_rows(global_shape[0], world_size)
                                             : std::vector<RowBlock>(static_cast<size_t>(world_size), {0, global_shape[0]});
  for (const RowBlock& b : dim0) {
    Box box = whole;
    box[0] = {b.begin, b.count};
    boxes.push_back(std::move(box));
  }
  return boxes;
}

}  // namespace dmuon::layout
