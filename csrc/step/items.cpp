// dmuon/step/items.cpp — items of every parameter and the pieces each rank holds.
#include "step/items.h"

#include <algorithm>

#include "common/check.h"

namespace dmuon::step {

ItemTable::ItemTable(std::vector<ParamSpec> params, int world_size)
    : world_size_(world_size), params_(std::move(params)) {
  DMUON_CHECK(world_size_ >= 1, "ItemTable: world size must be >= 1, got ", world_size_);
  for (size_t p = 0; p < params_.size(); ++p) {
    const ParamSpec& spec = params_[p];
    spec.layout.validate(spec.name.c_str());
    DMUON_CHECK(spec.group >= 0, "parameter '", spec.name, "': group index ", spec.group, " is negative");
    DMUON_CHECK(spec.dtype != DType::kInt32, "parameter '", spec.name, "': dtype int32 is not a floating-point type");
    if (spec.whole_on_rank >= 0) {
      DMUON_CHECK(spec.whole_on_rank < world_size_, "parameter '", spec.name, "': whole on rank ", spec.whole_on_rank,
                  ", outside a world of ", world_size_);
      DMUON_CHECK(!spec.layout.sharded, "parameter '", spec.name, "': whole on rank ", spec.whole_on_rank,
                  ", but its layout is sharded");
      std::vector<dist::RowBlock> rows(static_cast<size_t>(world_size_));
      rows[static_cast<size_t>(spec.whole_on_rank)] = {0, spec.layout.flat_rows()};
      rows_.push_back(std::move(rows));
    } else {
      DMUON_CHECK(spec.whole_on_rank == -1, "parameter '", spec.name, "': whole_on_rank ", spec.whole_on_rank,
                  " (use -1 for the layout's pieces)");
      rows_.push_back(spec.layout.rank_rows(world_size_));
    }
    const int first = static_cast<int>(items_.size());
    const int64_t m = spec.layout.matrix_rows(), n = spec.layout.cols();
    if (m > 0 && n > 0) {
      for (int64_t e = 0; e < spec.layout.num_matrices(); ++e) {
        items_.push_back({static_cast<int>(p), e, m, n, spec.group, spec.dtype});
        // The rows of matrix e ([e·m, (e+1)·m) of the flat rows) each rank holds.
        for (int r = 0; r < world_size_; ++r) {
          const dist::RowBlock block = rows_.back()[static_cast<size_t>(r)];
          const int64_t lo = std::max(block.begin, e * m), hi = std::min(block.begin + block.count, (e + 1) * m);
          Piece piece;
          if (hi > lo) piece = {lo - e * m, hi - lo, (lo - block.begin) * n};
          pieces_.push_back(piece);
        }
      }
    }
    item_range_.emplace_back(first, static_cast<int>(items_.size()) - first);
  }
}

const Piece& ItemTable::piece(int item_idx, int rank) const {
  DMUON_CHECK(item_idx >= 0 && item_idx < num_items() && rank >= 0 && rank < world_size_, "ItemTable::piece: item ",
              item_idx, " of ", num_items(), ", rank ", rank, " of ", world_size_);
  return pieces_[static_cast<size_t>(item_idx) * static_cast<size_t>(world_size_) + static_cast<size_t>(rank)];
}

dist::RowBlock ItemTable::local_rows(int param_idx, int rank) const {
  return rows_.at(static_cast<size_t>(param_idx)).at(static_cast<size_t>(rank));
}

int64_t ItemTable::local_numel(int param_idx, int rank) const {
  return local_rows(param_idx, rank).count * param(param_idx).layout.cols();
}

std::string ItemTable::item_name(int item_idx) const {
  const Item& it = item(item_idx);
  const ParamSpec& spec = param(it.param_idx);
  if (spec.layout.batch_dims == 0) return spec.name;
  return spec.name + "[" + std::to_string(it.matrix_idx) + "]";
}

}  // namespace dmuon::step
