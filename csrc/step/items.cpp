// dmuon/step/items.cpp — items of every parameter, the block each rank holds of each, and
// the replica sets of those blocks.
#include "step/items.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "common/check.h"

namespace dmuon::step {
namespace {

// The flat matrix's view of a box: local flat rows and the column range it holds.
struct BoxView {
  int64_t row_dim = 0;  // the tensor dim of each matrix's rows (1 for a stack)
  int64_t local_cols = 0, col_begin = 0;
};

// Columns are the flattened trailing dims: a box must hold a range of the first of them
// and all of the others, or its local tensor is not a column range of the flat matrix.
BoxView view_of(const ParamSpec& spec, const layout::Box& box) {
  const std::vector<int64_t>& shape = spec.layout.global_shape;
  BoxView v;
  v.row_dim = spec.layout.batch_dims;
  const size_t first_col = static_cast<size_t>(v.row_dim) + 1;
  int64_t inner = 1;
  for (size_t d = first_col + 1; d < shape.size(); ++d) {
    DMUON_CHECK(box[d].count == shape[d] || layout::box_numel(box) == 0, "parameter '", spec.name,
                "': its placements split tensor dim ", d, ", which DMuon flattens into the columns of its matrices "
                "(only the first column dim, ", first_col, ", may be split",
                spec.layout.mesh ? "; placements " + spec.layout.mesh->describe() : std::string(), ")");
    inner *= shape[d];
  }
  v.local_cols = box[first_col].count * inner;
  v.col_begin = box[first_col].begin * inner;
  return v;
}

}  // namespace

ItemTable::ItemTable(std::vector<ParamSpec> params, int world_size)
    : world_size_(world_size), params_(std::move(params)) {
  DMUON_CHECK(world_size_ >= 1, "ItemTable: world size must be >= 1, got ", world_size_);
  for (size_t p = 0; p < params_.size(); ++p) {
    const ParamSpec& spec = params_[p];
    spec.layout.validate(spec.name.c_str());
    DMUON_CHECK(spec.group >= 0, "parameter '", spec.name, "': group index ", spec.group, " is negative");
    DMUON_CHECK(spec.dtype != DType::kInt32, "parameter '", spec.name, "': dtype int32 is not a floating-point type");
    const std::vector<int64_t>& shape = spec.layout.global_shape;
    layout::Box whole, none;
    for (int64_t d : shape) whole.push_back({0, d}), none.push_back({0, 0});
    std::vector<layout::Box> boxes;
    if (spec.whole_on_rank >= 0) {
      DMUON_CHECK(spec.whole_on_rank < world_size_, "parameter '", spec.name, "': whole on rank ", spec.whole_on_rank,
                  ", outside a world of ", world_size_);
      DMUON_CHECK(!spec.layout.sharded && !spec.layout.mesh, "parameter '", spec.name, "': whole on rank ",
                  spec.whole_on_rank, ", but its layout is sharded");
      boxes.assign(static_cast<size_t>(world_size_), none);
      boxes[static_cast<size_t>(spec.whole_on_rank)] = whole;
    } else {
      DMUON_CHECK(spec.whole_on_rank == -1, "parameter '", spec.name, "': whole_on_rank ", spec.whole_on_rank,
                  " (use -1 for the layout's pieces)");
      boxes = spec.layout.rank_boxes(world_size_, "parameter '" + spec.name + "'");
    }
    // NOTE: an empty box (a trailing chunk) holds nothing, wherever torch.chunk put it.
    for (layout::Box& b : boxes)
      if (layout::box_numel(b) == 0) b = none;
    boxes_.push_back(boxes);

    const int first = static_cast<int>(items_.size());
    const int64_t m = spec.layout.matrix_rows(), n = spec.layout.matrix_cols();
    if (m > 0 && n > 0) {
      const std::vector<layout::RowBlock> blocks = spec.layout.matrix_blocks();
      for (int64_t e = 0; e < spec.layout.num_matrices(); ++e) {
        const int64_t rows = blocks[static_cast<size_t>(e)].count;
        items_.push_back({static_cast<int>(p), e, rows, n, spec.group, spec.dtype});
        for (int r = 0; r < world_size_; ++r) {
          const layout::Box& box = boxes[static_cast<size_t>(r)];
          Piece piece;
          if (layout::box_numel(box) > 0) {
            const BoxView v = view_of(spec, box);
            if (spec.layout.batch_dims == 1) {
              // Matrix e of a stack (a row block of one of its matrices): the box's rows inside it
              // when it holds that matrix of the stack.
              const int64_t per_dim0 = spec.layout.rows_per_dim0();
              const layout::RowBlock& block = blocks[static_cast<size_t>(e)];
              const int64_t stacked = block.begin / per_dim0, begin = block.begin % per_dim0;
              const int64_t lo = std::max(box[1].begin, begin);
              const int64_t hi = std::min(box[1].begin + box[1].count, begin + rows);
              if (stacked >= box[0].begin && stacked < box[0].begin + box[0].count && hi > lo)
                piece = {lo - begin, hi - lo,
                         ((stacked - box[0].begin) * box[1].count + lo - box[1].begin) * v.local_cols, v.col_begin,
                         v.local_cols};
            } else if (spec.layout.splits_cols()) {
              // Column block e: the box's rows × its columns inside [e·n, (e+1)·n), rows
              // v.local_cols apart in the local tensor.
              const int64_t lo = std::max(v.col_begin, e * n);
              const int64_t hi = std::min(v.col_begin + v.local_cols, (e + 1) * n);
              if (hi > lo) piece = {box[0].begin, box[0].count, lo - v.col_begin, lo - e * n, hi - lo, v.local_cols};
            } else {
              // A matrix (or a row block of one): the box's rows inside it.
              const int64_t lo = std::max(box[0].begin, blocks[static_cast<size_t>(e)].begin);
              const int64_t hi = std::min(box[0].begin + box[0].count, blocks[static_cast<size_t>(e)].begin + rows);
              if (hi > lo)
                piece = {lo - blocks[static_cast<size_t>(e)].begin, hi - lo, (lo - box[0].begin) * v.local_cols,
                         v.col_begin, v.local_cols};
            }
          }
          pieces_.push_back(piece);
        }
      }
    }
    item_range_.emplace_back(first, static_cast<int>(items_.size()) - first);
  }
  // Replica sets: per item, the lowest rank holding each block.
  lowest_holder_.assign(pieces_.size(), -1);
  for (int i = 0; i < num_items(); ++i) {
    std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, int> lowest;
    for (int r = 0; r < world_size_; ++r) {
      const Piece& p = piece(i, r);
      if (p.empty()) continue;
      const auto key = std::make_tuple(p.row_begin, p.row_count, p.col_begin, p.col_count);
      lowest_holder_[static_cast<size_t>(i) * static_cast<size_t>(world_size_) + static_cast<size_t>(r)] =
          lowest.emplace(key, r).first->second;
    }
  }
}

const Piece& ItemTable::piece(int item_idx, int rank) const {
  DMUON_CHECK(item_idx >= 0 && item_idx < num_items() && rank >= 0 && rank < world_size_, "ItemTable::piece: item ",
              item_idx, " of ", num_items(), ", rank ", rank, " of ", world_size_);
  return pieces_[static_cast<size_t>(item_idx) * static_cast<size_t>(world_size_) + static_cast<size_t>(rank)];
}

int ItemTable::source(int item_idx, int holder, int dest) const {
  const Piece& mine = piece(item_idx, holder);
  if (mine.empty()) return -1;
  const Piece& theirs = piece(item_idx, dest);
  if (!theirs.empty() && theirs.same_block(mine)) return dest;
  return lowest_holder_[static_cast<size_t>(item_idx) * static_cast<size_t>(world_size_) + static_cast<size_t>(holder)];
}

bool ItemTable::replicated_on(int item_idx, int rank) const {
  const Piece& mine = piece(item_idx, rank);
  if (mine.empty()) return false;
  for (int r = 0; r < world_size_; ++r)
    if (r != rank && piece(item_idx, r).same_block(mine)) return true;
  return false;
}

int ItemTable::first_whole_holder(int item_idx) const {
  for (int r = 0; r < world_size_; ++r)
    if (whole_on(item_idx, r)) return r;
  return -1;
}

layout::RowBlock ItemTable::local_rows(int param_idx, int rank) const {
  const ParamSpec& spec = param(param_idx);
  const layout::Box& box = boxes_.at(static_cast<size_t>(param_idx)).at(static_cast<size_t>(rank));
  if (layout::box_numel(box) == 0) return {0, 0};
  if (spec.layout.batch_dims == 1)
    return {box[0].begin * spec.layout.rows_per_dim0() + box[1].begin, box[0].count * box[1].count};
  return {box[0].begin, box[0].count};
}

layout::RowBlock ItemTable::local_cols(int param_idx, int rank) const {
  const layout::Box& box = boxes_.at(static_cast<size_t>(param_idx)).at(static_cast<size_t>(rank));
  if (layout::box_numel(box) == 0) return {0, 0};
  const BoxView v = view_of(param(param_idx), box);
  return {v.col_begin, v.local_cols};
}

bool ItemTable::strided_on(int param_idx, int rank) const {
  const auto [first, count] = items_of(param_idx);
  for (int i = first; i < first + count; ++i)
    if (piece(i, rank).strided()) return true;
  return false;
}

int64_t ItemTable::local_numel(int param_idx, int rank) const {
  return layout::box_numel(boxes_.at(static_cast<size_t>(param_idx)).at(static_cast<size_t>(rank)));
}

std::string ItemTable::item_name(int item_idx) const {
  const Item& it = item(item_idx);
  const ParamSpec& spec = param(it.param_idx);
  if (spec.layout.splits_cols()) return spec.name + "[:, " + std::to_string(it.matrix_idx) + "]";
  if (spec.layout.batch_dims == 0) return spec.name;
  // A stack's matrix by its index in the stack (its row blocks share it).
  const int64_t blocks = spec.layout.row_blocks.empty() ? 1 : static_cast<int64_t>(spec.layout.row_blocks.size());
  return spec.name + "[" + std::to_string(it.matrix_idx / blocks) + "]";
}

}  // namespace dmuon::step
