// dmuon/step/device_ops.h — the passes the step engine needs from a device (CPU or CUDA).
//
// The engine never touches element data: it calls a DeviceOps with lists of pieces (views
// of parameters, gradients, momentum buffers and wire buffers). The ops own the stream
// order: every call is enqueued in call order on the ops' stream (the CPU runs it at
// once); the transport orders its collectives into that stream. Every writing pass takes a
// `gate` (an int32 [1] device buffer, or empty): non-zero at run time turns it into a
// no-op (iterates get zeros), so a step whose check failed changes nothing without a host
// wait (the one-process step). What an NS iterate holds (normalized or not, its element
// type and orientation) is the ops' business: the engine only routes it between the ops'
// own passes.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include "autotune/tune_cache.h"
#include "ns/schedule.h"
#include "optim/normuon.h"
#include "step/types.h"

namespace dmuon::step {

/// The momentum rule of a param group: buf ← lerp(buf, g, 1 − μ); U ← lerp(g, buf, μ)
/// with Nesterov, else buf.
struct MomentumRule {
  double momentum = 0.95;
  bool nesterov = true;
};

/// copy()'s pair: dst ← src.
struct CopyPiece {
  Buffer src, dst;
};

/// Read by check(): a piece of a parameter's gradient and momentum buffer.
struct CheckPiece {
  Buffer grad, momentum;
  MomentumRule rule;
  int flag_idx = 0;         ///< flags[2·flag_idx] |= gradient non-finite, [2·flag_idx + 1] |= momentum
  bool sum_update = false;  ///< also the partial sums of U² (a whole item bound for this rank's iterate)
};

/// check()'s partial sums: those of the j-th sum_update piece occupy
/// [offset[j], offset[j] + count[j]) of `buffer` (layout and element type: the ops').
struct Partials {
  OwnedBuffer buffer;
  std::vector<int64_t> offset, count;
};

/// Read by fingerprint(): a view's elements (any dtype; strided where the ops take strided
/// pieces), hashed with `salt` (the engine's: the item's id).
struct FingerprintPiece {
  Buffer data;
  uint64_t salt = 0;
};

/// Momentum in place on a piece and, when `wire` is not empty, U cast into it.
struct PreparePiece {
  Buffer grad, momentum;
  MomentumRule rule;
  Buffer wire;  ///< wire dtype, the piece's element count; empty: momentum only
};

/// One NS batch: `count` rows×cols matrices of parameters of `param_dtype`.
struct NsBatchDesc {
  int64_t rows = 0, cols = 0, count = 0;
  DType param_dtype = DType::kFloat32;
  const ns::Schedule* schedule = nullptr;
  bool graphs = true;  ///< may capture and replay CUDA graphs
};

/// An iterate or result of an NS batch, as laid out by the ops that made it: matrix k at
/// data + k·batch_stride elements, rows of `ld` elements; `transposed`: stored cols×rows.
struct NsView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t ld = 0, batch_stride = 0;
  bool transposed = false;
  /// Row factors its consumers apply as they read it (NorMuon on CUDA, DeviceOps::normuon):
  /// item row i of matrix k reads as O_ki · row_scale[k·rows + i] where row_scaled[k] is
  /// non-zero (device memory). Null: the result as it is.
  const float* row_scale = nullptr;
  const int* row_scaled = nullptr;
};

/// A whole item this rank holds, written into matrix `matrix_idx` of the iterate.
struct LocalMatrix {
  Buffer grad, momentum;
  MomentumRule rule;
  int partial_idx = -1;  ///< its check() partials (−1: none; the ops then sum themselves)
  int64_t matrix_idx = 0;
};

/// Rows [row_begin, row_begin + row_count) × columns [col_begin, col_begin + col_count)
/// of matrix `matrix_idx` of an NS batch, [row_count, col_count] row-major in a wire
/// buffer (what iterate_from_pieces reads and result_to_pieces writes). col_count < 0:
/// every column (a row piece).
struct WirePiece {
  Buffer wire;
  int64_t matrix_idx = 0;
  int64_t row_begin = 0, row_count = 0;
  int64_t col_begin = 0, col_count = -1;
};

/// p ← p·decay + scale·O on the block rows [row_begin, row_begin + row_count) × columns
/// [col_begin, col_begin + col_count) of matrix `matrix_idx` (apply_result; p is that
/// block, contiguous) or from `wire` (apply_pieces); a non-finite entry of O is not
/// applied (only the decay is) and sets result_flags[flag_idx]. col_count < 0: every column.
struct ApplyPiece {
  Buffer param;
  Buffer wire;  ///< apply_pieces only
  int64_t matrix_idx = 0;
  int64_t row_begin = 0, row_count = 0;
  double scale = 0.0, decay = 1.0;
  int flag_idx = 0;
  /// apply_result only: O rounded to `wire_dtype` first. NOTE: an owner's rows that other
  /// ranks also hold (a replicated parameter) must take the values the replicas receive,
  /// or the replicas drift apart under a lossy wire.
  bool round_through_wire = false;
  DType wire_dtype = DType::kFloat32;
  int64_t col_begin = 0, col_count = -1;
};

/// NorMuon's state of matrix `matrix_idx` of an NS batch: v, float32 [rows] (all of them).
struct NormuonMatrix {
  Buffer v;
  int64_t matrix_idx = 0;
  int flag_idx = 0;  ///< result_flags[flag_idx] ← 1 when O is not finite (v is then left as it was)
};

/// Throws, naming `what` (the ops' normuon), unless `m` is a matrix of `batch` with a float32
/// v of one value per item row and a flag in `result_flags`.
void check_normuon_matrix(const char* what, const NormuonMatrix& m, const NsBatchDesc& batch,
                          const Buffer& result_flags);

/// Throws dmuon::Error naming `what` (the ops' fingerprint) unless `sum` is int32 [2] and
/// every piece of 2, 4 or 8-byte elements, on `device`.
void check_fingerprint(const char* what, const std::vector<FingerprintPiece>& pieces, const Buffer& sum,
                       const Device& device);

/// Throws dmuon::Error naming `what` unless `src` holds `num_parts` parts of dst's size
/// `part_stride` apart, both contiguous on one device (the ops' sum_into check).
void check_sum_into(const char* what, const Buffer& src, int64_t num_parts, int64_t part_stride, const Buffer& dst);

/// The columns [begin, begin + count) of a piece in `batch` (col_count < 0: all of them).
inline std::pair<int64_t, int64_t> piece_cols(const NsBatchDesc& batch, int64_t col_begin, int64_t col_count) {
  return col_count < 0 ? std::pair<int64_t, int64_t>{0, batch.cols} : std::pair<int64_t, int64_t>{col_begin, col_count};
}

/// Throws dmuon::Error naming `what` unless rows [row_begin, row_begin + row_count) ×
/// columns [col_begin, col_begin + col_count) (col_count < 0: all) of matrix
/// `matrix_idx` lie in `batch` and hold `numel` elements (the ops' argument check).
void check_batch_rows(const char* what, const NsBatchDesc& batch, int64_t matrix_idx, int64_t row_begin,
                      int64_t row_count, int64_t numel, int64_t col_begin = 0, int64_t col_count = -1);

/// Whether the DeviceOps of `device` step a parameter of `dtype`; when not, *reason (if
/// given) says why. The CUDA ops consult it too, so that both agree.
bool ops_support(DeviceKind device, DType dtype, std::string* reason = nullptr);

/// Where measured times live (autotune/tune_cache.h: one file holds one environment).
struct MeasurementStore {
  std::string path;  ///< empty: this process's memory only
  autotune::TuneEnvironment environment;
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual Device device() const = 0;
  /// Whether these ops step parameters of `dtype` (else false and why): by default what
  /// the device's torch-free ops do (ops_support).
  virtual bool supports(DType dtype, std::string* why) const;
  /// Whether the passes over local tensors of `dtype` (check, prepare_pieces,
  /// prepare_to_iterate, apply_result, apply_pieces, copy) take strided views
  /// (step/types.h Buffer: pieces of column blocks); the engine refuses column blocks
  /// where they do not.
  virtual bool strided_pieces(DType /*dtype*/) const { return false; }

  /// Memory for `numel` elements, released (stream-ordered) when the handle dies.
  virtual OwnedBuffer allocate(DType dtype, int64_t numel) = 0;
  virtual void fill_zero(const Buffer& buffer) = 0;
  /// Pseudo-random values of unit variance (uniform on ±√3), a function of `seed` and the
  /// element index only: what a transport that moves no data (a fake world) leaves in the
  /// updates an owner orthogonalizes (full rank, as real data; see layout/world_model.h).
  virtual void fill_synthetic(const Buffer& buffer, uint64_t seed) = 0;
  /// dst ← src for every pair (same dtype and size each; either side may be strided where
  /// strided_pieces says so), in one pass where the ops can.
  virtual void copy(const std::vector<CopyPiece>& pieces) = 0;
  /// dst ← scale · Σ_k part_k (+ dst when `accumulate`), part k the dst.numel elements of
  /// `src` from k·part_stride: summed in float32 or wider (float64 for float64), rounded to
  /// dst's dtype once; src and dst of any floating dtypes (the weight-ownership mode's
  /// gradients into their buckets, a bucket's pieces reduced on their owner). Contiguous
  /// buffers only.
  virtual void sum_into(const Buffer& src, int64_t num_parts, int64_t part_stride, const Buffer& dst, double scale, bool accumulate) = 0;

  /// Reads only: NaN/Inf flags (int32, zeroed by the caller) and U² partials.
  virtual Partials check(const std::vector<CheckPiece>& pieces, const Buffer& flags) = 0;
  /// sum (int32 [2]: one uint64, low word first; read with read_flags) += the fingerprint
  /// of the pieces' bits (step/fingerprint.h). Reads only.
  virtual void fingerprint(const std::vector<FingerprintPiece>& pieces, const Buffer& sum) = 0;
  /// int32 [1]: non-zero when any of `flags` is.
  virtual OwnedBuffer make_gate(const Buffer& flags) = 0;
  /// Momentum in place and U into the wire (pieces not bound for this rank's iterate).
  virtual void prepare_pieces(const std::vector<PreparePiece>& pieces, const Buffer& gate) = 0;

  /// Bytes of NS workspace of `count` rows×cols matrices (the NS batch bound).
  virtual int64_t ns_workspace_bytes(int64_t rows, int64_t cols, int64_t count, DType param_dtype,
                                     ns::Algorithm algorithm) const = 0;
  /// Fills the iterate (fill(iterate, first): `first` on the first call; the ops may call
  /// it again, e.g. to tune, so it must only update momentum when `first`), orthogonalizes
  /// it, and hands the result to consume() before its memory is reused.
  virtual void orthogonalize(const NsBatchDesc& batch, const std::function<void(const NsView&, bool first)>& fill,
                             const std::function<void(const NsView&)>& consume) = 0;
  /// Inside fill(): whole local items into the iterate (momentum updated when
  /// update_momentum, else read as already updated).
  virtual void prepare_to_iterate(const std::vector<LocalMatrix>& matrices, const Partials& partials,
                                  const NsBatchDesc& batch, const NsView& iterate, bool update_momentum,
                                  const Buffer& gate) = 0;
  /// Inside fill(): the norm over every piece of a matrix, then the pieces into the iterate.
  virtual void iterate_from_pieces(const std::vector<WirePiece>& pieces, const NsBatchDesc& batch,
                                   const NsView& iterate, const Buffer& gate) = 0;
  /// Inside consume(): result rows into wire pieces (wire dtype of each piece's buffer).
  virtual void result_to_pieces(const NsView& result, const NsBatchDesc& batch,
                                const std::vector<WirePiece>& pieces) = 0;
  /// Inside consume(): this rank's rows applied straight from the result.
  virtual void apply_result(const NsView& result, const NsBatchDesc& batch, const std::vector<ApplyPiece>& pieces,
                            const Buffer& gate, const Buffer& result_flags) = 0;
  /// Inside consume(), before the result is returned or applied: NorMuon's row
  /// normalization of each listed matrix of the result, and its v updated
  /// (optim/normuon.h); a matrix whose O is not finite keeps v and raises its flag. The ops
  /// either scale the result in place or leave row factors on `result` (NsView::row_scale)
  /// for result_to_pieces / apply_result to apply as they read; the returned memory holds
  /// those factors: keep it until the consumers are enqueued. By default: not supported
  /// (throws naming the device).
  virtual OwnedBuffer normuon(NsView& result, const NsBatchDesc& batch, const std::vector<NormuonMatrix>& matrices,
                              const optim::NormuonRule& rule, const Buffer& gate, const Buffer& result_flags);
  /// Rows returned by their owner, applied from the wire.
  virtual void apply_pieces(const std::vector<ApplyPiece>& pieces, const Buffer& gate,
                            const Buffer& result_flags) = 0;

  /// The host values of int32 buffers, concatenated: waits for everything enqueued.
  virtual std::vector<int32_t> read_flags(const std::vector<Buffer>& buffers) = 0;
  /// Waits for everything enqueued (profiling).
  virtual void synchronize() = 0;
  /// Device-time marks (step/phase_clock.h, PhaseTiming::kDevice). Whether the ops make
  /// them; by default not: their calls run at once, so host time is theirs (the CPU).
  virtual bool device_marks() const { return false; }
  /// A mark enqueued on the ops' stream: its id (valid until clear_marks()).
  virtual int64_t record_mark();
  /// Device seconds from mark `from` to mark `to`; waits for `to`.
  virtual double mark_seconds(int64_t from, int64_t to);
  /// Forgets every mark (their ids may be given again).
  virtual void clear_marks() {}
  /// Where times measured on these ops are kept (step/cost_profile.h): the store's file
  /// (empty: this process's memory) and what the times depend on besides the problem. By
  /// default memory only, under the device's name and dmuon's version.
  virtual MeasurementStore measurement_store() const;
  /// run(k) for every k in order, batch k's work on stream stream_of[k] (0: the ops'
  /// stream); every stream starts after what was enqueued before and the ops' stream waits
  /// for all of them before this returns. Returns the number of streams used.
  virtual int run_on_streams(const std::vector<int>& stream_of, const std::function<void(size_t)>& run) = 0;
};

}  // namespace dmuon::step
