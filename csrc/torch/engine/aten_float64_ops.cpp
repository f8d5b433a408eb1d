// dmuon/torch/engine/aten_float64_ops.cpp — the float64 work of the step through ATen,
// everything else through the device's own ops (see the header).
#include "engine/aten_float64_ops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "common/check.h"
#include "engine/aten_ns.h"
#include "step/forwarding_ops.h"
#include "step_tensors.h"

namespace dmuon::torch_adapter {
namespace {

using step::Buffer;
using step::DType;

bool is_f64(const Buffer& b) { return b.dtype == DType::kFloat64; }

// The iterate or result of a float64 batch as a [count, rows, cols] tensor (these ops
// make it row-major, never transposed).
at::Tensor batch_view(const step::NsView& v, const step::NsBatchDesc& batch, const Buffer& like) {
  DMUON_CHECK(v.dtype == DType::kFloat64 && !v.transposed && v.ld == batch.cols &&
                  v.batch_stride == batch.rows * batch.cols,
              "the float64 ops got an iterate they did not make");
  const Buffer whole{v.data, DType::kFloat64, batch.count * batch.rows * batch.cols, like.device};
  return tensor_view(whole).view({batch.count, batch.rows, batch.cols});
}

// A piece's [row_count, col_count] block of matrix `matrix_idx` of a float64 batch (checked
// against the batch, `what` naming the call in the error).
at::Tensor piece_block(const char* what, const step::NsView& v, const step::NsBatchDesc& batch, const Buffer& like,
                       int64_t matrix_idx, int64_t row_begin, int64_t row_count, int64_t numel, int64_t col_begin,
                       int64_t col_count) {
  step::check_batch_rows(what, batch, matrix_idx, row_begin, row_count, numel, col_begin, col_count);
  const auto [first_col, num_cols] = step::piece_cols(batch, col_begin, col_count);
  return batch_view(v, batch, like).select(0, matrix_idx).narrow(0, row_begin, row_count).narrow(1, first_col, num_cols);
}

// `value` where the gate is open, `keep` where it is closed (no host read).
at::Tensor gated(const Buffer& gate, const at::Tensor& keep, const at::Tensor& value) {
  if (gate.empty()) return value;
  return at::where(tensor_view(gate).ne(0), keep, value);
}

// The momentum rule on (g, m): the new momentum and U, in float64 (ATen's lerp, as the CPU ops).
std::pair<at::Tensor, at::Tensor> momentum_and_update(const at::Tensor& g, const at::Tensor& m,
                                                      const step::MomentumRule& rule, bool update) {
  at::Tensor next = update ? at::lerp(m, g, 1.0 - rule.momentum) : m;
  at::Tensor u = rule.nesterov ? at::lerp(g, next, rule.momentum) : next;
  return {next, u};
}

// p ← p·decay + scale·O where O is finite (p·decay where not, and the result flag raised).
void apply_rows(const Buffer& param, at::Tensor o, double scale, double decay, const Buffer& gate,
                const Buffer& flags, int flag_idx) {
  at::Tensor p = tensor_view(param).view(o.sizes());
  const at::Tensor finite = at::isfinite(o);
  at::Tensor next = decay != 1.0 ? p * decay : p.clone();
  next.add_(at::where(finite, o, at::zeros_like(o)), scale);
  p.copy_(gated(gate, p, next));
  at::Tensor flag = tensor_view(flags).narrow(0, flag_idx, 1);
  const at::Tensor bad = at::logical_not(finite).any().to(at::kInt).view({1});
  flag.copy_(gated(gate, flag, at::maximum(flag, bad)));
}

// NOTE: every call the float64 work does not need goes to the device's ops unchanged
// (step::ForwardingOps); this class owns them.
class AtenFloat64Ops : public step::ForwardingOps {
 public:
  explicit AtenFloat64Ops(std::unique_ptr<step::DeviceOps> inner) : ForwardingOps(*inner), owned_(std::move(inner)) {}
  step::DeviceOps& inner() { return inner_; }

  bool supports(DType dtype, std::string* why) const override {
    return dtype == DType::kFloat64 || inner_.supports(dtype, why);
  }
  /// The device's ops' answer for every dtype but float64, whose ATen passes read
  /// contiguous pieces only.
  bool strided_pieces(DType dtype) const override {
    return dtype != DType::kFloat64 && inner_.strided_pieces(dtype);
  }

  // NOTE: the inner ops check float64 pieces (flags only); their U² partials are not
  // summed there (the float64 iterate is normalized by the NS): the summed pieces keep
  // their indices, those of float64 pieces pointing at no partials.
  step::Partials check(const std::vector<step::CheckPiece>& pieces, const Buffer& flags) override {
    std::vector<step::CheckPiece> inner = pieces;
    std::vector<int> summed;  // per summed piece: its index among the inner ops' summed pieces, or −1
    int next = 0;
    for (step::CheckPiece& piece : inner) {
      if (!piece.sum_update) continue;
      if (is_f64(piece.grad)) {
        piece.sum_update = false;
        summed.push_back(-1);
      } else {
        summed.push_back(next++);
      }
    }
    step::Partials got = inner_.check(inner, flags);
    if (next == static_cast<int>(summed.size())) return got;
    step::Partials out;
    out.buffer = std::move(got.buffer);
    for (int k : summed) {
      out.offset.push_back(k < 0 ? 0 : got.offset[static_cast<size_t>(k)]);
      out.count.push_back(k < 0 ? 0 : got.count[static_cast<size_t>(k)]);
    }
    return out;
  }

  void prepare_pieces(const std::vector<step::PreparePiece>& pieces, const Buffer& gate) override {
    std::vector<step::PreparePiece> rest;
    for (const step::PreparePiece& piece : pieces) {
      if (!is_f64(piece.grad)) {
        rest.push_back(piece);
        continue;
      }
      const at::Tensor g = tensor_view(piece.grad), m = tensor_view(piece.momentum);
      auto [next, u] = momentum_and_update(g, m, piece.rule, true);
      if (!piece.wire.empty()) {
        at::Tensor wire = tensor_view(piece.wire);
        wire.copy_(gated(gate, wire, u.to(wire.scalar_type())));
      }
      m.copy_(gated(gate, m, next));
    }
    if (!rest.empty()) inner_.prepare_pieces(rest, gate);
  }

  int64_t ns_workspace_bytes(int64_t rows, int64_t cols, int64_t count, DType dtype,
                             ns::Algorithm algorithm) const override {
    if (dtype != DType::kFloat64) return inner_.ns_workspace_bytes(rows, cols, count, dtype, algorithm);
    // NOTE: the iterate, the normalized copy, two m×n iterates and five m×m matrices
    // (orthogonalize's ATen Gram workspace; the standard one is smaller), m ≤ n.
    const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
    return count * (4 * m * n + 5 * m * m) * 8;
  }

  void orthogonalize(const step::NsBatchDesc& batch, const std::function<void(const step::NsView&, bool)>& fill,
                     const std::function<void(const step::NsView&)>& consume) override {
    if (batch.param_dtype != DType::kFloat64) return inner_.orthogonalize(batch, fill, consume);
    DMUON_CHECK(batch.schedule != nullptr, "AtenFloat64Ops::orthogonalize: a batch without a schedule");
    const auto options = at::TensorOptions().dtype(at::kDouble).device(torch_device(inner_.device()));
    at::Tensor iterate = at::empty({batch.count, batch.rows, batch.cols}, options);
    fill(view_of(iterate, batch), true);
    // NOTE: normalized by its Frobenius norm (clamped at eps), made wide, iterated in float64.
    at::Tensor result = aten_orthogonalize(iterate, *batch.schedule, at::kDouble).contiguous();
    consume(view_of(result, batch));
  }

  void prepare_to_iterate(const std::vector<step::LocalMatrix>& matrices, const step::Partials& partials,
                          const step::NsBatchDesc& batch, const step::NsView& iterate, bool update_momentum,
                          const Buffer& gate) override {
    if (batch.param_dtype != DType::kFloat64)
      return inner_.prepare_to_iterate(matrices, partials, batch, iterate, update_momentum, gate);
    for (const step::LocalMatrix& matrix : matrices) {
      at::Tensor dst = batch_view(iterate, batch, matrix.grad).select(0, matrix.matrix_idx);
      const at::Tensor g = tensor_view(matrix.grad).view({batch.rows, batch.cols});
      const at::Tensor m = tensor_view(matrix.momentum).view({batch.rows, batch.cols});
      auto [next, u] = momentum_and_update(g, m, matrix.rule, update_momentum);
      dst.copy_(gated(gate, at::zeros_like(u), u));
      if (update_momentum) m.copy_(gated(gate, m, next));
    }
  }

  void iterate_from_pieces(const std::vector<step::WirePiece>& pieces, const step::NsBatchDesc& batch,
                           const step::NsView& iterate, const Buffer& gate) override {
    if (batch.param_dtype != DType::kFloat64) return inner_.iterate_from_pieces(pieces, batch, iterate, gate);
    for (const step::WirePiece& piece : pieces) {
      at::Tensor dst = piece_block("AtenFloat64Ops::iterate_from_pieces", iterate, batch, piece.wire, piece.matrix_idx,
                                   piece.row_begin, piece.row_count, piece.wire.numel, piece.col_begin, piece.col_count);
      const at::Tensor rows = tensor_view(piece.wire).view(dst.sizes()).to(at::kDouble);
      dst.copy_(gated(gate, at::zeros_like(rows), rows));
    }
  }

  void result_to_pieces(const step::NsView& result, const step::NsBatchDesc& batch,
                        const std::vector<step::WirePiece>& pieces) override {
    if (batch.param_dtype != DType::kFloat64) return inner_.result_to_pieces(result, batch, pieces);
    for (const step::WirePiece& piece : pieces) {
      const at::Tensor rows = piece_block("AtenFloat64Ops::result_to_pieces", result, batch, piece.wire,
                                          piece.matrix_idx, piece.row_begin, piece.row_count, piece.wire.numel,
                                          piece.col_begin, piece.col_count);
      tensor_view(piece.wire).view(rows.sizes()).copy_(rows);
    }
  }

  void apply_result(const step::NsView& result, const step::NsBatchDesc& batch,
                    const std::vector<step::ApplyPiece>& pieces, const Buffer& gate,
                    const Buffer& result_flags) override {
    if (batch.param_dtype != DType::kFloat64) return inner_.apply_result(result, batch, pieces, gate, result_flags);
    for (const step::ApplyPiece& piece : pieces) {
      at::Tensor o = piece_block("AtenFloat64Ops::apply_result", result, batch, piece.param, piece.matrix_idx,
                                 piece.row_begin, piece.row_count, piece.param.numel, piece.col_begin, piece.col_count);
      // NOTE: the replicas apply what the wire brings them; so does the owner.
      if (piece.round_through_wire) o = o.to(scalar_type(piece.wire_dtype)).to(at::kDouble);
      apply_rows(piece.param, o, piece.scale, piece.decay, gate, result_flags, piece.flag_idx);
    }
  }

  // NorMuon (optim/normuon.h) of float64 batches with ATen, in place (their result is these
  // ops' float64 iterate): sums in float64, v float32, nothing written where the gate is closed
  // or O is not finite (the flag is raised then). Other batches go to the inner ops (the
  // CPU rule, or the CUDA kernels on the batch's stream: step/cuda/normuon_kernels.h).
  step::OwnedBuffer normuon(step::NsView& result, const step::NsBatchDesc& batch,
                            const std::vector<step::NormuonMatrix>& matrices, const optim::NormuonRule& rule,
                            const Buffer& gate, const Buffer& result_flags) override {
    if (batch.param_dtype != DType::kFloat64) return inner_.normuon(result, batch, matrices, rule, gate, result_flags);
    if (matrices.empty()) return {};
    // The batch's listed matrices at once ([k, rows, cols] views of the result, whatever
    // its storage order; their v stacked): a fixed number of launches per NS batch.
    at::Tensor flags = tensor_view(result_flags);
    std::vector<int64_t> index;
    std::vector<at::Tensor> vs;
    for (const step::NormuonMatrix& m : matrices) {
      DMUON_CHECK(m.matrix_idx >= 0 && m.matrix_idx < batch.count && m.v.dtype == DType::kFloat32 &&
                      m.v.numel == batch.rows && m.flag_idx >= 0 && m.flag_idx < result_flags.numel,
                  "normuon: matrix ", m.matrix_idx, " of ", batch.count, " with ", m.v.numel, " state entries for ",
                  batch.rows, " rows");
      index.push_back(m.matrix_idx);
      vs.push_back(tensor_view(m.v));
    }
    const int64_t span = (batch.count - 1) * result.batch_stride +
                         (result.transposed ? (batch.cols - 1) * result.ld + batch.rows
                                            : (batch.rows - 1) * result.ld + batch.cols);
    const Buffer storage{result.data, result.dtype, span, matrices.front().v.device};
    const at::Tensor all =
        result.transposed
            ? tensor_view(storage).as_strided({batch.count, batch.rows, batch.cols}, {result.batch_stride, 1, result.ld})
            : tensor_view(storage).as_strided({batch.count, batch.rows, batch.cols}, {result.batch_stride, result.ld, 1});
    const at::Tensor idx = at::tensor(index, at::TensorOptions().dtype(at::kLong)).to(all.device());
    const at::Tensor od = all.index_select(0, idx).to(at::kDouble);  // [k, rows, cols]
    const at::Tensor v = at::stack(vs);                              // [k, rows] float32
    const at::Tensor row_sq = (od * od).sum(2);                      // [k, rows]
    const at::Tensor norm_sq = row_sq.sum(1);                        // [k]
    at::Tensor ok = at::isfinite(norm_sq);
    const at::Tensor v_next =
        (v.to(at::kDouble) * rule.beta2 + row_sq * ((1.0 - rule.beta2) / static_cast<double>(batch.cols)))
            .to(at::kFloat);
    const at::Tensor d = v_next.to(at::kDouble).sqrt() + rule.eps;
    const at::Tensor hat_sq = (row_sq / (d * d)).sum(1);
    const at::Tensor keep = at::where(hat_sq > 0, (norm_sq / hat_sq).sqrt(), at::ones_like(hat_sq));
    const at::Tensor o_next = (od * (keep.unsqueeze(1) / d).unsqueeze(2)).to(all.scalar_type());
    const at::Tensor open = gate.empty() ? at::ones_like(ok) : tensor_view(gate).eq(0).reshape({}).expand_as(ok);
    const at::Tensor bad = (open & ~ok).to(flags.scalar_type());
    ok = ok & open;
    const at::Tensor v_out = at::where(ok.unsqueeze(1), v_next, v);
    all.index_copy_(0, idx, at::where(ok.view({-1, 1, 1}), o_next, all.index_select(0, idx)));
    for (size_t j = 0; j < matrices.size(); ++j) {
      vs[j].copy_(v_out.select(0, static_cast<int64_t>(j)));
      at::Tensor flag = flags.narrow(0, matrices[j].flag_idx, 1);
      flag.copy_(at::maximum(flag, bad.narrow(0, static_cast<int64_t>(j), 1)));
    }
    return {};
  }

  void apply_pieces(const std::vector<step::ApplyPiece>& pieces, const Buffer& gate,
                    const Buffer& result_flags) override {
    std::vector<step::ApplyPiece> rest;
    for (const step::ApplyPiece& piece : pieces) {
      if (!is_f64(piece.param)) {
        rest.push_back(piece);
        continue;
      }
      DMUON_CHECK(piece.wire.numel == piece.param.numel, "AtenFloat64Ops::apply_pieces: ", piece.wire.numel,
                  " returned elements for ", piece.param.numel, " of the parameter");
      apply_rows(piece.param, tensor_view(piece.wire).to(at::kDouble), piece.scale, piece.decay, gate, result_flags,
                 piece.flag_idx);
    }
    if (!rest.empty()) inner_.apply_pieces(rest, gate, result_flags);
  }

 private:
  static step::NsView view_of(const at::Tensor& t, const step::NsBatchDesc& batch) {
    return step::NsView{t.data_ptr(), DType::kFloat64, batch.cols, batch.rows * batch.cols, false};
  }

  std::unique_ptr<step::DeviceOps> owned_;  // what ForwardingOps::inner_ refers to
};

}  // namespace

std::unique_ptr<step::DeviceOps> with_aten_float64(std::unique_ptr<step::DeviceOps> inner) {
  return std::make_unique<AtenFloat64Ops>(std::move(inner));
}

step::DeviceOps& device_ops_of(step::DeviceOps& ops) {
  auto* wrapper = dynamic_cast<AtenFloat64Ops*>(&ops);
  return wrapper != nullptr ? wrapper->inner() : ops;
}

}  // namespace dmuon::torch_adapter
