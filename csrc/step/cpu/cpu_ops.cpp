// dmuon/step/cpu/cpu_ops.cpp — the engine's passes on host memory.
#include "step/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "step/cpu/cpu_elements.h"
#include "step/cpu/flush_denormals.h"
#include "step/fingerprint.h"
#include "step/synthetic.h"

namespace dmuon::step {
namespace {

using cpu::dispatch_compute;
using cpu::dispatch_float;
using cpu::Elem;
using cpu::round_to;

bool gate_closed(const Buffer& gate) { return !gate.empty() && gate.as<const int32_t>()[0] != 0; }

// ATen's lerp (aten/src/ATen/native/Lerp.h), in the arithmetic type of the tensor.
template <typename C>
C lerp(C self, C end, C weight) {
  return std::abs(weight) < C(0.5) ? self + weight * (end - self) : end - (end - self) * (C(1) - weight);
}

// Element i of a piece (i: its offset in the memory, Buffer::offset_of): the momentum
// after its lerp (written when `update`, else read as already updated), and U, both
// rounded to the parameter dtype P.
template <typename P>
typename Elem<P>::Compute momentum_update(const P* grad, P* momentum, int64_t i, const MomentumRule& rule,
                                          bool update) {
  using C = typename Elem<P>::Compute;
  const C g = Elem<P>::load(grad[i]);
  C m = Elem<P>::load(momentum[i]);
  if (update) {
    // NOTE: the weight is cast to the arithmetic type, as torch casts its Scalar.
    m = round_to<P>(lerp(m, g, static_cast<C>(1.0 - rule.momentum)));
    momentum[i] = Elem<P>::store(m);
  }
  return rule.nesterov ? round_to<P>(lerp(g, m, static_cast<C>(rule.momentum))) : m;
}

// NOTE: views of the same piece (gradient, momentum, parameter) share their strides, so
// one offset_of() serves both.
void check_same(const Buffer& a, const Buffer& b, const char* what) {
  DMUON_CHECK(a.dtype == b.dtype && a.numel == b.numel && a.offset_of(a.numel - 1) == b.offset_of(b.numel - 1), what,
              ": ", dtype_name(a.dtype), "[", a.numel, "] vs ", dtype_name(b.dtype), "[", b.numel,
              "] (or different strides)");
}

// p ← round(round(p·decay) + scale·O) with O rounded to P first (torch's .to(param dtype),
// _foreach_mul_, _foreach_add_(alpha=scale)); a non-finite O is not applied.
template <typename P>
void apply_element(P* param, int64_t i, typename Elem<P>::Compute o, double scale, double decay, bool& bad) {
  using C = typename Elem<P>::Compute;
  C p = Elem<P>::load(param[i]);
  if (decay != 1.0) p = round_to<P>(p * static_cast<C>(decay));
  if (!std::isfinite(o)) {
    bad = true;
    o = C(0);
  }
  param[i] = Elem<P>::store(p + static_cast<C>(scale) * o);
}

}  // namespace

DType cpu_iterate_dtype(DType param_dtype) {
  return param_dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

CpuOps::CpuOps(CpuOpsOptions options) : options_(std::move(options)) {
  if (!options_.parallel_for) options_.parallel_for = ns::serial_for;
  // NS chunks flush subnormals on whichever thread runs them (a pool's workers keep
  // their own floating-point mode).
  options_.parallel_for = [inner = std::move(options_.parallel_for)](
                              int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    inner(n, [&body](int64_t begin, int64_t end) {
      const cpu::FlushDenormals flush;
      body(begin, end);
    });
  };
}

OwnedBuffer CpuOps::allocate(DType dtype, int64_t numel) {
  DMUON_CHECK(numel >= 0, "CpuOps::allocate: ", numel, " elements");
  Buffer buffer{nullptr, dtype, numel, device()};
  if (numel == 0) return OwnedBuffer(buffer, nullptr);
  // NOTE: 64-byte alignment (a cache line), rounded up as aligned_alloc requires.
  const size_t bytes = static_cast<size_t>(numel * dtype_size(dtype));
  buffer.data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  DMUON_CHECK(buffer.data != nullptr, "CpuOps::allocate: out of memory for ", bytes, " bytes");
  if (options_.poison_allocations) std::memset(buffer.data, 0xff, bytes);  // NOTE: NaN in every float type
  return OwnedBuffer(buffer, [](const Buffer& b) { std::free(b.data); });
}

void CpuOps::fill_zero(const Buffer& buffer) {
  if (buffer.numel > 0) std::memset(buffer.data, 0, static_cast<size_t>(buffer.bytes()));
}

void CpuOps::fill_synthetic(const Buffer& buffer, uint64_t seed) {
  dispatch_float(buffer.dtype, [&](auto zero) {
    using T = decltype(zero);
    T* out = buffer.as<T>();
    for (int64_t i = 0; i < buffer.numel; ++i)
      out[i] = Elem<T>::template store<float>(synthetic_value(seed, static_cast<uint64_t>(i)));
  });
}

void CpuOps::copy(const std::vector<CopyPiece>& pieces) {
  for (const auto& [src, dst] : pieces) {
    DMUON_CHECK(src.dtype == dst.dtype && src.numel == dst.numel, "CpuOps::copy: ", dtype_name(src.dtype), "[",
                src.numel, "] vs ", dtype_name(dst.dtype), "[", dst.numel, "]");
    if (src.numel == 0) continue;
    if (!src.strided() && !dst.strided()) {
      std::memcpy(dst.data, src.data, static_cast<size_t>(src.bytes()));
      continue;
    }
    // Strided views (pieces of column blocks): element by element.
    const int64_t size = dtype_size(src.dtype);
    const char* from = static_cast<const char*>(src.data);
    char* to = static_cast<char*>(dst.data);
    for (int64_t i = 0; i < src.numel; ++i)
      std::memcpy(to + dst.offset_of(i) * size, from + src.offset_of(i) * size, static_cast<size_t>(size));
  }
}

// NOTE: summed in double, rounded once into dst's type.
void CpuOps::sum_into(const Buffer& src, int64_t num_parts, int64_t part_stride, const Buffer& dst, double scale, bool accumulate) {
  const int64_t n = dst.numel;
  check_sum_into("CpuOps::sum_into", src, num_parts, part_stride, dst);
  if (n == 0) return;
  dispatch_float(src.dtype, [&](auto src_zero) {
    using S = decltype(src_zero);
    dispatch_float(dst.dtype, [&](auto dst_zero) {
      using D = decltype(dst_zero);
      const S* from = src.as<const S>();
      D* to = dst.as<D>();
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0.0;
        for (int64_t k = 0; k < num_parts; ++k) sum += static_cast<double>(Elem<S>::load(from[k * part_stride + i]));
        const double base = accumulate ? static_cast<double>(Elem<D>::load(to[i])) : 0.0;
        to[i] = Elem<D>::template store<double>(base + scale * sum);
      }
    });
  });
}

Partials CpuOps::check(const std::vector<CheckPiece>& pieces, const Buffer& flags) {
  DMUON_CHECK(flags.dtype == DType::kInt32, "CpuOps::check: flags must be int32");
  int32_t* f = flags.as<int32_t>();
  Partials partials;
  for (const CheckPiece& piece : pieces) {
    check_same(piece.grad, piece.momentum, "CpuOps::check: gradient and momentum");
    DMUON_CHECK(2 * piece.flag_idx + 1 < flags.numel, "CpuOps::check: flag index ", piece.flag_idx, " out of range");
    dispatch_float(piece.grad.dtype, [&](auto zero) {
      using P = decltype(zero);
      const P* g = piece.grad.as<const P>();
      const P* m = piece.momentum.as<const P>();
      bool grad_ok = true, momentum_ok = true;
      for (int64_t k = 0; k < piece.grad.numel; ++k) {
        const int64_t i = piece.grad.offset_of(k);
        grad_ok = grad_ok && std::isfinite(Elem<P>::load(g[i]));
        momentum_ok = momentum_ok && std::isfinite(Elem<P>::load(m[i]));
      }
      if (!grad_ok) f[2 * piece.flag_idx] = 1;
      if (!momentum_ok) f[2 * piece.flag_idx + 1] = 1;
    });
    // NOTE: orthogonalize_cpu sums the norm itself; no partials are kept.
    if (piece.sum_update) {
      partials.offset.push_back(0);
      partials.count.push_back(0);
    }
  }
  return partials;
}

void CpuOps::fingerprint(const std::vector<FingerprintPiece>& pieces, const Buffer& sum) {
  check_fingerprint("CpuOps::fingerprint", pieces, sum, device());
  uint64_t total = 0;
  std::memcpy(&total, sum.data, sizeof(total));
  for (const FingerprintPiece& piece : pieces) {
    const uint64_t key = fingerprint_key(piece.salt);
    const Buffer& b = piece.data;
    if (b.empty()) continue;
    with_element_bits(dtype_size(b.dtype), [&](auto zero) {
      using Bits = decltype(zero);
      const Bits* bits = b.as<const Bits>();
      for (int64_t k = 0; k < b.numel; ++k) total += fingerprint_term(bits[b.offset_of(k)], key, k);
    });
  }
  std::memcpy(sum.data, &total, sizeof(total));
}

OwnedBuffer CpuOps::make_gate(const Buffer& flags) {
  OwnedBuffer gate = allocate(DType::kInt32, 1);
  int32_t any = 0;
  for (int64_t i = 0; i < flags.numel; ++i) any = any || flags.as<const int32_t>()[i] != 0;
  gate.get().as<int32_t>()[0] = any;
  return gate;
}

void CpuOps::prepare_pieces(const std::vector<PreparePiece>& pieces, const Buffer& gate) {
  const cpu::FlushDenormals flush;
  if (gate_closed(gate)) return;
  for (const PreparePiece& piece : pieces) {
    check_same(piece.grad, piece.momentum, "CpuOps::prepare_pieces: gradient and momentum");
    DMUON_CHECK(piece.wire.empty() || piece.wire.numel == piece.grad.numel, "CpuOps::prepare_pieces: a wire of ",
                piece.wire.numel, " elements for a piece of ", piece.grad.numel);
    dispatch_float(piece.grad.dtype, [&](auto pz) {
      using P = decltype(pz);
      const P* g = piece.grad.as<const P>();
      P* m = piece.momentum.as<P>();
      if (piece.wire.empty()) {
        for (int64_t k = 0; k < piece.grad.numel; ++k) momentum_update(g, m, piece.grad.offset_of(k), piece.rule, true);
        return;
      }
      dispatch_float(piece.wire.dtype, [&](auto wz) {
        using W = decltype(wz);
        W* w = piece.wire.as<W>();
        for (int64_t k = 0; k < piece.grad.numel; ++k)
          w[k] = Elem<W>::store(momentum_update(g, m, piece.grad.offset_of(k), piece.rule, true));
      });
    });
  }
}

int64_t CpuOps::ns_workspace_bytes(int64_t rows, int64_t cols, int64_t count, DType param_dtype,
                                   ns::Algorithm) const {
  // The iterate of the batch, plus one matrix's scratch of orthogonalize_cpu (2 m×n
  // iterates and 5 m×m products).
  const int64_t elem = dtype_size(cpu_iterate_dtype(param_dtype));
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  return (count * rows * cols + 2 * m * n + 5 * m * m) * elem;
}

void CpuOps::orthogonalize(const NsBatchDesc& batch, const std::function<void(const NsView&, bool first)>& fill,
                           const std::function<void(const NsView&)>& consume) {
  const cpu::FlushDenormals flush;
  DMUON_CHECK(batch.schedule != nullptr && batch.count >= 1 && batch.rows >= 1 && batch.cols >= 1,
              "CpuOps::orthogonalize: invalid batch [", batch.count, ", ", batch.rows, ", ", batch.cols, "]");
  const DType dtype = cpu_iterate_dtype(batch.param_dtype);
  const int64_t stride = batch.rows * batch.cols;
  OwnedBuffer iterate = allocate(dtype, batch.count * stride);
  const NsView view{iterate.get().data, dtype, batch.cols, stride, false};
  fill(view, true);
  dispatch_compute(dtype, [&](auto zero) {
    using C = decltype(zero);
    {
      C* data = iterate.get().as<C>();
      // NOTE: orthogonalize_cpu refuses a non-finite matrix; such a matrix (a wire that
      // overflowed) gets NaN instead, which apply refuses and flags.
      std::vector<bool> finite(static_cast<size_t>(batch.count), true);
      bool all_finite = true;
      for (int64_t k = 0; k < batch.count; ++k) {
        for (int64_t i = 0; i < stride && finite[static_cast<size_t>(k)]; ++i)
          finite[static_cast<size_t>(k)] = std::isfinite(data[k * stride + i]);
        all_finite = all_finite && finite[static_cast<size_t>(k)];
      }
      if (all_finite) {
        ns::orthogonalize_cpu<C>(*batch.schedule, data, batch.count, batch.rows, batch.cols, options_.parallel_for);
      } else {
        for (int64_t k = 0; k < batch.count; ++k) {
          if (finite[static_cast<size_t>(k)])
            ns::orthogonalize_cpu<C>(*batch.schedule, data + k * stride, 1, batch.rows, batch.cols,
                                     options_.parallel_for);
          else
            std::fill(data + k * stride, data + (k + 1) * stride, std::numeric_limits<C>::quiet_NaN());
        }
      }
    }
  });
  consume(view);
}

void CpuOps::prepare_to_iterate(const std::vector<LocalMatrix>& matrices, const Partials&, const NsBatchDesc& batch,
                                const NsView& iterate, bool update_momentum, const Buffer& gate) {
  const cpu::FlushDenormals flush;
  const bool closed = gate_closed(gate);
  const int64_t stride = batch.rows * batch.cols;
  dispatch_compute(iterate.dtype, [&](auto iz) {
    using C = decltype(iz);
    C* it = static_cast<C*>(iterate.data);
    for (const LocalMatrix& matrix : matrices) {
      DMUON_CHECK(matrix.matrix_idx >= 0 && matrix.matrix_idx < batch.count && matrix.grad.numel == stride,
                  "CpuOps::prepare_to_iterate: matrix ", matrix.matrix_idx, " of ", matrix.grad.numel,
                  " elements in a batch of ", batch.count, " ", batch.rows, "x", batch.cols);
      check_same(matrix.grad, matrix.momentum, "CpuOps::prepare_to_iterate: gradient and momentum");
      C* dst = it + matrix.matrix_idx * iterate.batch_stride;
      if (closed) {
        std::fill(dst, dst + stride, C(0));
        continue;
      }
      dispatch_float(matrix.grad.dtype, [&](auto pz) {
        using P = decltype(pz);
        const P* g = matrix.grad.as<const P>();
        P* m = matrix.momentum.as<P>();
        for (int64_t i = 0; i < stride; ++i)
          dst[i] = static_cast<C>(momentum_update(g, m, matrix.grad.offset_of(i), matrix.rule, update_momentum));
      });
    }
  });
}

void CpuOps::iterate_from_pieces(const std::vector<WirePiece>& pieces, const NsBatchDesc& batch,
                                 const NsView& iterate, const Buffer& gate) {
  const bool closed = gate_closed(gate);
  dispatch_compute(iterate.dtype, [&](auto iz) {
    using C = decltype(iz);
    C* it = static_cast<C*>(iterate.data);
    for (const WirePiece& piece : pieces) {
      check_batch_rows("CpuOps::iterate_from_pieces", batch, piece.matrix_idx, piece.row_begin, piece.row_count,
                       piece.wire.numel, piece.col_begin, piece.col_count);
      const auto [c0, nc] = piece_cols(batch, piece.col_begin, piece.col_count);
      C* dst = it + piece.matrix_idx * iterate.batch_stride + piece.row_begin * batch.cols + c0;
      dispatch_float(piece.wire.dtype, [&](auto wz) {
        using W = decltype(wz);
        const W* w = piece.wire.as<const W>();
        for (int64_t r = 0; r < piece.row_count; ++r)
          for (int64_t c = 0; c < nc; ++c)
            dst[r * batch.cols + c] = closed ? C(0) : static_cast<C>(Elem<W>::load(w[r * nc + c]));
      });
    }
  });
}

void CpuOps::result_to_pieces(const NsView& result, const NsBatchDesc& batch, const std::vector<WirePiece>& pieces) {
  DMUON_CHECK(result.row_scale == nullptr, "CpuOps::result_to_pieces: a result with row factors of other ops");
  dispatch_compute(result.dtype, [&](auto rz) {
    using C = decltype(rz);
    const C* out = static_cast<const C*>(result.data);
    for (const WirePiece& piece : pieces) {
      check_batch_rows("CpuOps::result_to_pieces", batch, piece.matrix_idx, piece.row_begin, piece.row_count,
                       piece.wire.numel, piece.col_begin, piece.col_count);
      const auto [c0, nc] = piece_cols(batch, piece.col_begin, piece.col_count);
      const C* src = out + piece.matrix_idx * result.batch_stride + piece.row_begin * batch.cols + c0;
      dispatch_float(piece.wire.dtype, [&](auto wz) {
        using W = decltype(wz);
        W* w = piece.wire.as<W>();
        for (int64_t r = 0; r < piece.row_count; ++r)
          for (int64_t c = 0; c < nc; ++c) w[r * nc + c] = Elem<W>::store(src[r * batch.cols + c]);
      });
    }
  });
}

void CpuOps::apply_result(const NsView& result, const NsBatchDesc& batch, const std::vector<ApplyPiece>& pieces,
                          const Buffer& gate, const Buffer& result_flags) {
  const cpu::FlushDenormals flush;
  DMUON_CHECK(result.row_scale == nullptr, "CpuOps::apply_result: a result with row factors of other ops");
  if (gate_closed(gate)) return;
  dispatch_compute(result.dtype, [&](auto rz) {
    using R = decltype(rz);
    const R* out = static_cast<const R*>(result.data);
    for (const ApplyPiece& piece : pieces) {
      check_batch_rows("CpuOps::apply_result", batch, piece.matrix_idx, piece.row_begin, piece.row_count,
                       piece.param.numel, piece.col_begin, piece.col_count);
      DMUON_CHECK(piece.flag_idx >= 0 && piece.flag_idx < result_flags.numel, "CpuOps::apply_result: flag index ",
                  piece.flag_idx, " out of range");
      const auto [c0, nc] = piece_cols(batch, piece.col_begin, piece.col_count);
      const R* src = out + piece.matrix_idx * result.batch_stride + piece.row_begin * batch.cols + c0;
      // Element i of the block (row-major [row_count, nc]) in the result.
      auto at = [&, nc = nc](int64_t i) { return src[(i / nc) * batch.cols + i % nc]; };
      bool bad = false;
      dispatch_float(piece.param.dtype, [&](auto pz) {
        using P = decltype(pz);
        using C = typename Elem<P>::Compute;
        P* p = piece.param.as<P>();
        if (!piece.round_through_wire) {
          for (int64_t i = 0; i < piece.param.numel; ++i)
            apply_element(p, piece.param.offset_of(i), round_to<P>(static_cast<C>(at(i))), piece.scale, piece.decay,
                          bad);
          return;
        }
        dispatch_float(piece.wire_dtype, [&](auto wz) {
          using W = decltype(wz);
          for (int64_t i = 0; i < piece.param.numel; ++i)
            apply_element(p, piece.param.offset_of(i), round_to<P>(static_cast<C>(round_to<W>(at(i)))), piece.scale,
                          piece.decay, bad);
        });
      });
      if (bad) result_flags.as<int32_t>()[piece.flag_idx] = 1;
    }
  });
}

void CpuOps::apply_pieces(const std::vector<ApplyPiece>& pieces, const Buffer& gate, const Buffer& result_flags) {
  const cpu::FlushDenormals flush;
  if (gate_closed(gate)) return;
  for (const ApplyPiece& piece : pieces) {
    DMUON_CHECK(piece.wire.numel == piece.param.numel, "CpuOps::apply_pieces: ", piece.wire.numel,
                " wire elements for ", piece.param.numel, " parameter elements");
    DMUON_CHECK(piece.flag_idx >= 0 && piece.flag_idx < result_flags.numel, "CpuOps::apply_pieces: flag index ",
                piece.flag_idx, " out of range");
    bool bad = false;
    dispatch_float(piece.param.dtype, [&](auto pz) {
      using P = decltype(pz);
      using C = typename Elem<P>::Compute;
      P* p = piece.param.as<P>();
      dispatch_float(piece.wire.dtype, [&](auto wz) {
        using W = decltype(wz);
        const W* w = piece.wire.as<const W>();
        for (int64_t i = 0; i < piece.param.numel; ++i)
          apply_element(p, piece.param.offset_of(i), round_to<P>(static_cast<C>(Elem<W>::load(w[i]))), piece.scale,
                        piece.decay, bad);
      });
    });
    if (bad) result_flags.as<int32_t>()[piece.flag_idx] = 1;
  }
}

OwnedBuffer CpuOps::normuon(NsView& result, const NsBatchDesc& batch, const std::vector<NormuonMatrix>& matrices,
                            const optim::NormuonRule& rule, const Buffer& gate, const Buffer& result_flags) {
  const cpu::FlushDenormals flush;
  if (gate_closed(gate)) return {};
  dispatch_compute(result.dtype, [&](auto rz) {
    using R = decltype(rz);
    R* out = static_cast<R*>(result.data);
    const optim::MatrixRef ref{batch.rows, batch.cols, result.ld, result.transposed};
    for (const NormuonMatrix& m : matrices) {
      check_normuon_matrix("CpuOps::normuon", m, batch, result_flags);
      if (!optim::normuon_matrix<R>(out + m.matrix_idx * result.batch_stride, ref, m.v.as<float>(), rule))
        result_flags.as<int32_t>()[m.flag_idx] = 1;
    }
  });
  return {};
}

std::vector<int32_t> CpuOps::read_flags(const std::vector<Buffer>& buffers) {
  std::vector<int32_t> out;
  for (const Buffer& b : buffers) {
    DMUON_CHECK(b.dtype == DType::kInt32, "CpuOps::read_flags: expected int32 buffers");
    out.insert(out.end(), b.as<const int32_t>(), b.as<const int32_t>() + b.numel);
  }
  return out;
}

int CpuOps::run_on_streams(const std::vector<int>& stream_of, const std::function<void(size_t)>& run) {
  for (size_t k = 0; k < stream_of.size(); ++k) run(k);
  return 1;
}

}  // namespace dmuon::step
