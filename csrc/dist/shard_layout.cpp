// dmuon/dist/shard_layout.cpp — row blocks of sharded and replicated parameters.
#include "dist/shard_layout.h"

#include <algorithm>

#include "common/check.h"

namespace dmuon::dist {

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
}

int64_t ParamLayout::rows_per_dim0() const { return batch_dims == 1 ? global_shape[1] : 1; }

int64_t ParamLayout::flat_rows() const { return global_shape[0] * rows_per_dim0(); }

int64_t ParamLayout::cols() const {
  int64_t cols = 1;
  for (size_t d = 1 + static_cast<size_t>(batch_dims); d < global_shape.size(); ++d) cols *= global_shape[d];
  return cols;
}

int64_t ParamLayout::num_matrices() const { return batch_dims == 1 ? global_shape[0] : 1; }

int64_t ParamLayout::matrix_rows() const {
  return batch_dims == 1 ? global_shape[1] : global_shape[0];
}

std::vector<RowBlock> ParamLayout::rank_rows(int world_size) const {
  if (!sharded) return std::vector<RowBlock>(static_cast<size_t>(world_size), {0, flat_rows()});
  std::vector<RowBlock> blocks = chunk_rows(global_shape[0], world_size);
  for (RowBlock& b : blocks) {
    b.begin *= rows_per_dim0();
    b.count *= rows_per_dim0();
  }
  return blocks;
}

}  // namespace dmuon::dist
