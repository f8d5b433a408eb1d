// dmuon/step/items.h — the units of the step: items (single matrices) and their pieces on
// every rank.
//
// An item is one matrix: a 2-D parameter (or one with trailing dims flattened, e.g. a 4-D
// conv weight [out, in·kh·kw]), one matrix of a 3-D stack (MoE experts: one item per
// matrix), one row block or one column block of a split parameter (a column
// block j of a [rows, k·d] weight is the rows×d item at column j·d). It is planned,
// exchanged and orthogonalized as a whole by one owner.
// A piece is what one rank holds of an item: a block, rows [row_begin, row_begin +
// row_count) × columns [col_begin, col_begin + col_count) of it (a row range is a block of
// all columns: FSDP2's Shard(0) chunk, all rows when replicated, possibly none; a mesh
// placement may split columns too, layout/placement.h), stored ([row_count, col_count],
// row-major) at an element offset of that rank's local tensors, its rows contiguous but
// for a column block's, which lie `ld` elements apart (the local tensor's row length:
// strided views, step/types.h). The wire carries every piece contiguous. Ranks that
// hold the same block of an item are its replica set: the lowest of them sends the block
// to a rank that needs it (source()), and every holder receives the result. Every rank
// derives the same table from the same parameter specs and world size. A parameter
// "whole on rank r" (ParamSpec::whole_on_rank) has one piece per matrix, all of it, on
// rank r only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "layout/shard_layout.h"
#include "step/types.h"

namespace dmuon::step {

/// One Muon parameter as every rank sees it (identical on every rank).
struct ParamSpec {
  std::string name;
  layout::ParamLayout layout;
  DType dtype = DType::kFloat32;  ///< of the parameter, its gradient and momentum buffer
  int group = 0;                  ///< index into the step's GroupRules
  /// ≥ 0: the layout kind "whole on rank r" (the weight-ownership mode): every matrix of
  /// the parameter exists only on rank r, which owns it (the owner comes from the caller's
  /// plan, not the engine's planner); every other rank holds none of it and passes empty
  /// tensors. The layout must then be unsharded. −1: the pieces follow `layout`.
  int whole_on_rank = -1;
};

/// One matrix: rows×cols as stored in the parameter (tall when rows > cols).
struct Item {
  int param_idx = 0;
  int64_t matrix_idx = 0;  ///< which matrix of a stack (0 for a plain matrix)
  int64_t rows = 0, cols = 0;
  int group = 0;
  DType dtype = DType::kFloat32;
  int64_t numel() const { return rows * cols; }
};

/// What one rank holds of an item: a block of it (row_count × col_count).
struct Piece {
  int64_t row_begin = 0;     ///< first row, within the item
  int64_t row_count = 0;     ///< rows held (0: none)
  int64_t local_offset = 0;  ///< element offset into the rank's local tensors of the parameter
  int64_t col_begin = 0;     ///< first column, within the item
  int64_t col_count = 0;     ///< columns held (the item's cols for a row range; 0: none)
  int64_t ld = 0;            ///< elements between its rows in the local tensors (0: col_count, contiguous)
  bool empty() const { return row_count == 0 || col_count == 0; }
  int64_t numel() const { return row_count * col_count; }
  /// Whether its rows lie apart in the local tensors (a column block's piece of several rows).
  bool strided() const { return row_count > 1 && ld > col_count; }
  bool same_block(const Piece& o) const {
    return row_begin == o.row_begin && row_count == o.row_count && col_begin == o.col_begin && col_count == o.col_count;
  }
};

/// Items of every parameter and their pieces on every rank.
class ItemTable {
 public:
  /// Throws dmuon::Error naming the parameter when a spec is unusable. Matrices with no
  /// element (a zero dimension) have no item: there is nothing to orthogonalize.
  ItemTable(std::vector<ParamSpec> params, int world_size);

  int world_size() const { return world_size_; }
  int num_params() const { return static_cast<int>(params_.size()); }
  int num_items() const { return static_cast<int>(items_.size()); }
  const std::vector<ParamSpec>& params() const { return params_; }
  const ParamSpec& param(int param_idx) const { return params_.at(static_cast<size_t>(param_idx)); }
  const std::vector<Item>& items() const { return items_; }
  const Item& item(int item_idx) const { return items_.at(static_cast<size_t>(item_idx)); }
  /// Rank `rank`'s piece of item `item_idx`.
  const Piece& piece(int item_idx, int rank) const;
  /// Whether `rank` holds all of the item.
  bool whole_on(int item_idx, int rank) const {
    const Piece& p = piece(item_idx, rank);
    return p.row_count == item(item_idx).rows && p.col_count == item(item_idx).cols;
  }
  /// The rank that sends `holder`'s block of the item to `dest`: `dest` itself when it
  /// holds the same block (nothing travels), else the lowest rank holding it. −1 when
  /// `holder` holds nothing of it.
  int source(int item_idx, int holder, int dest) const;
  /// Whether `rank` holds a block of the item that some other rank holds too (a replica).
  bool replicated_on(int item_idx, int rank) const;
  /// The lowest rank that holds all of the item, or −1.
  int first_whole_holder(int item_idx) const;
  /// The items of a parameter: [first, first + count).
  std::pair<int, int> items_of(int param_idx) const { return item_range_.at(static_cast<size_t>(param_idx)); }
  /// Flat rows of a parameter that `rank` holds (its local tensors are [count, local
  /// cols]; `begin` is the flat row of its first, meaningful for row ranges).
  layout::RowBlock local_rows(int param_idx, int rank) const;
  /// Columns of the flat matrix of a parameter that `rank` holds.
  layout::RowBlock local_cols(int param_idx, int rank) const;
  /// The box of a parameter's tensor that `rank` holds (every count 0: none).
  const layout::Box& box(int param_idx, int rank) const {
    return boxes_.at(static_cast<size_t>(param_idx)).at(static_cast<size_t>(rank));
  }
  /// Whether any piece of a parameter's items on `rank` is strided (column blocks).
  bool strided_on(int param_idx, int rank) const;
  /// Elements of a parameter's local tensors on `rank`.
  int64_t local_numel(int param_idx, int rank) const;
  /// "name" for a plain matrix, "name[e]" for matrix e of a stack, "name[:, j]" for column
  /// block j (errors, plans).
  std::string item_name(int item_idx) const;

 private:
  int world_size_ = 1;
  std::vector<ParamSpec> params_;
  std::vector<Item> items_;
  std::vector<std::pair<int, int>> item_range_;     // [param] → (first item, count)
  std::vector<std::vector<layout::Box>> boxes_;      // [param][rank] its box of the tensor
  std::vector<Piece> pieces_;                      // [item · world + rank]
  std::vector<int> lowest_holder_;                 // [item · world + rank] lowest rank with the same block, −1: none
};

}  // namespace dmuon::step
