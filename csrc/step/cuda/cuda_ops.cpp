// dmuon/step/cuda/cuda_ops.cpp — the engine's passes on one GPU: descriptors → piece
// kernels, NS through the graph cache, side streams, stream-ordered memory.
#include "step/cuda/cuda_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <tuple>

#include "common/check.h"
#include "common/env.h"
#include "ns/cuda/autotune.h"
#include "ns/cuda/autotune_rules.h"
#include "ns/cuda/cuda_backend.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/matrix_list.h"
#include "step/cuda/graph_cache.h"
#include "step/cuda/normuon_kernels.h"
#include "step/cuda/piece_kernels.h"
#include "step/cuda/stream_set.h"
#include "step/cuda/sym_self_check.h"
#include "step/fingerprint.h"

namespace dmuon::step {
namespace {

// Makes `device` current for a scope and restores the previous one.
struct DeviceGuard {
  int previous = -1;
  explicit DeviceGuard(int device) {
    DMUON_CHECK_CUDA(cudaGetDevice(&previous));
    if (previous != device) DMUON_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous) cudaSetDevice(previous);
  }
};

ns::cuda::DType ns_dtype(DType dtype) {
  DMUON_CHECK(dtype == DType::kFloat16 || dtype == DType::kBFloat16, "an NS iterate is float16 or bfloat16, not ",
              dtype_name(dtype));
  return dtype == DType::kFloat16 ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
}

void require_supported(DType dtype) {
  std::string why;
  DMUON_CHECK(ops_support(DeviceKind::kCuda, dtype, &why), "CudaOps: ", dtype_name(dtype), " parameters: ", why);
}

cuda::IterateView view_of(const NsView& v, const NsBatchDesc& batch) {
  return {v.data, v.dtype, batch.rows, batch.cols, v.ld, v.batch_stride, v.row_scale, v.row_scaled};
}

const int* skip_of(const Buffer& gate) { return gate.empty() ? nullptr : gate.as<const int>(); }

// (row length, stride) of a strided view for a descriptor; (0, 0) for a contiguous one.
std::pair<int64_t, int64_t> strides_of(const Buffer& b) {
  return b.strided() ? std::pair<int64_t, int64_t>{b.row_len, b.ld} : std::pair<int64_t, int64_t>{0, 0};
}

}  // namespace

DType cuda_iterate_dtype(ns::Algorithm algorithm) {
  return algorithm == ns::Algorithm::kGram ? DType::kFloat16 : DType::kBFloat16;
}

bool cuda_device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

struct CudaOps::Impl {
  CudaOpsOptions options;
  std::string sym_path;  // DMUON_SYM_PATH when the ops were made
  std::unique_ptr<cuda::Allocator> own_allocator;
  cuda::Allocator* allocator = nullptr;
  cudaStream_t main = nullptr;
  bool own_stream = false;
  cudaStream_t current = nullptr;  // main, or a side stream inside run_on_streams
  std::unique_ptr<cuda::GraphCache> graphs;
  std::unique_ptr<cuda::StreamSet> streams;
  int32_t* pinned = nullptr;  // host copies of the flags
  size_t pinned_count = 0;
  std::vector<cudaEvent_t> marks;  // device-time marks, reused after clear_marks()
  size_t num_marks = 0;            // marks[0, num_marks) are recorded

  ~Impl() {
    graphs.reset();
    streams.reset();
    for (cudaEvent_t e : marks) cudaEventDestroy(e);
    if (own_stream && main != nullptr) {
      cudaStreamSynchronize(main);
      cudaStreamDestroy(main);
    }
    if (pinned != nullptr) cudaFreeHost(pinned);
  }
};

CudaOps::CudaOps(CudaOpsOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  // NOTE: read once, as every code-path knob is; a bad value is refused here, naming the variable.
  impl_->sym_path = env::kSymPath.get();
  ns::cuda::choose_sym_mode(impl_->sym_path, /*kernel_usable=*/true, options.sym_kernel);
  DMUON_CHECK(options.graph_cache_bytes >= 0, "CudaOps: graph_cache_bytes must be >= 0, got ",
              options.graph_cache_bytes);
  DeviceGuard guard(options.device);
  if (options.allocator == nullptr) {
    impl_->own_allocator = cuda::make_async_allocator();
    impl_->allocator = impl_->own_allocator.get();
  } else {
    impl_->allocator = options.allocator;
  }
  if (options.stream == nullptr) {
    DMUON_CHECK_CUDA(cudaStreamCreateWithFlags(&impl_->main, cudaStreamNonBlocking));
    impl_->own_stream = true;
  } else {
    impl_->main = static_cast<cudaStream_t>(options.stream);
  }
  impl_->current = impl_->main;
  impl_->graphs = std::make_unique<cuda::GraphCache>(*impl_->allocator, static_cast<size_t>(options.graph_cache_bytes));
  impl_->streams = std::make_unique<cuda::StreamSet>();
}

CudaOps::~CudaOps() {
  DeviceGuard guard(impl_->options.device);
  impl_.reset();
}

void* CudaOps::stream() const { return impl_->main; }

std::vector<int64_t> CudaOps::graph_stats() const { return impl_->graphs->stats(); }

Device CudaOps::device() const { return Device{DeviceKind::kCuda, impl_->options.device}; }

OwnedBuffer CudaOps::allocate(DType dtype, int64_t numel) {
  DMUON_CHECK(numel >= 0, "CudaOps::allocate: ", numel, " elements");
  Buffer buffer{nullptr, dtype, numel, device()};
  if (numel == 0) return OwnedBuffer(buffer, nullptr);
  DeviceGuard guard(impl_->options.device);
  const size_t bytes = static_cast<size_t>(numel * dtype_size(dtype));
  cuda::Allocator* allocator = impl_->allocator;
  cudaStream_t stream = impl_->current;
  buffer.data = allocator->allocate(bytes, stream);
  DMUON_CHECK(buffer.data != nullptr, "CudaOps::allocate: no memory for ", bytes, " bytes");
  // NOTE: released in the order of the stream it was made for (its users are on it, or
  // joined into it by run_on_streams before the release).
  return OwnedBuffer(buffer, [allocator, bytes, stream](const Buffer& b) { allocator->release(b.data, bytes, stream); });
}

void CudaOps::fill_zero(const Buffer& buffer) {
  if (buffer.numel == 0) return;
  DeviceGuard guard(impl_->options.device);
  DMUON_CHECK_CUDA(cudaMemsetAsync(buffer.data, 0, static_cast<size_t>(buffer.bytes()), impl_->current));
}

void CudaOps::fill_synthetic(const Buffer& buffer, uint64_t seed) {
  if (buffer.numel == 0) return;
  DeviceGuard guard(impl_->options.device);
  cuda::fill_synthetic(buffer.dtype, buffer.data, buffer.numel, seed, impl_->current);
}

void CudaOps::sum_into(const Buffer& src, int64_t num_parts, int64_t part_stride, const Buffer& dst, double scale, bool accumulate) {
  check_sum_into("CudaOps::sum_into", src, num_parts, part_stride, dst);
  if (dst.numel == 0) return;
  DeviceGuard guard(impl_->options.device);
  cuda::sum_into(src.dtype, src.data, num_parts, part_stride, dst.dtype, dst.data, dst.numel, scale, accumulate,
                 impl_->current);
}

bool CudaOps::strided_pieces(DType dtype) const { return ops_support(DeviceKind::kCuda, dtype, nullptr); }

// NOTE: one launch per unit size for the whole list (a stage's staged momentum is one
// list): contiguous pairs move 16 bytes a thread where both ends allow, strided rows an
// element a thread.
void CudaOps::copy(const std::vector<CopyPiece>& pieces) {
  std::map<int, std::vector<cuda::CopyDesc>> by_unit;
  for (const auto& [src, dst] : pieces) {
    DMUON_CHECK(src.dtype == dst.dtype && src.numel == dst.numel, "CudaOps::copy: ", dtype_name(src.dtype), "[",
                src.numel, "] into ", dtype_name(dst.dtype), "[", dst.numel, "]");
    if (src.numel == 0) continue;
    for (const Buffer* b : {&src, &dst})
      DMUON_CHECK(!b->strided() || src.numel % b->row_len == 0, "CudaOps::copy: ", src.numel,
                  " elements are not rows of ", b->row_len);
    const int64_t elem = dtype_size(src.dtype);
    const auto aligned = [](const void* p, int64_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    if (!src.strided() && !dst.strided() && src.bytes() % 16 == 0 && aligned(src.data, 16) && aligned(dst.data, 16)) {
      by_unit[16].push_back({src.data, dst.data, src.bytes() / 16, 0, 0, 0, 0});
      continue;
    }
    const auto [src_row_len, src_ld] = strides_of(src);
    const auto [dst_row_len, dst_ld] = strides_of(dst);
    by_unit[static_cast<int>(elem)].push_back({src.data, dst.data, src.numel, src_row_len, src_ld, dst_row_len, dst_ld});
  }
  if (by_unit.empty()) return;
  DeviceGuard guard(impl_->options.device);
  for (const auto& [unit, descs] : by_unit) cuda::copy(unit, descs, impl_->current);
}

Partials CudaOps::check(const std::vector<CheckPiece>& pieces, const Buffer& flags) {
  DMUON_CHECK(flags.dtype == DType::kInt32, "CudaOps::check: flags must be int32");
  DeviceGuard guard(impl_->options.device);
  Partials out;
  int64_t total = 0;
  std::map<DType, std::vector<cuda::CheckDesc>> by_dtype;
  for (const CheckPiece& piece : pieces) {
    // NOTE: any floating-point piece may be checked (e.g. a float64 AdamW gradient); only
    // the ones summed for an iterate must be of a dtype the CUDA step supports.
    if (piece.sum_update) require_supported(piece.grad.dtype);
    DMUON_CHECK(piece.grad.dtype == piece.momentum.dtype && piece.grad.numel == piece.momentum.numel &&
                    piece.grad.dtype != DType::kInt32,
                "CudaOps::check: gradient and momentum differ, or are not floating-point");
    DMUON_CHECK(strides_of(piece.grad) == strides_of(piece.momentum),
                "CudaOps::check: gradient and momentum laid out differently");
    cuda::CheckDesc d{piece.grad.data, piece.momentum.data, piece.grad.numel,
                      cuda::make_rule(piece.rule.momentum, piece.rule.nesterov), piece.flag_idx, -1};
    std::tie(d.row_len, d.ld) = strides_of(piece.grad);
    if (piece.sum_update) {
      d.partial_offset = total;
      out.offset.push_back(total);
      out.count.push_back(cuda::num_chunks(piece.grad.numel));
      total += out.count.back();
    }
    by_dtype[piece.grad.dtype].push_back(d);
  }
  out.buffer = allocate(DType::kFloat32, std::max<int64_t>(1, total));
  for (const auto& [dtype, descs] : by_dtype)
    cuda::check(dtype, descs, flags.as<int>(), out.buffer.get().as<float>(), impl_->current);
  return out;
}

void CudaOps::fingerprint(const std::vector<FingerprintPiece>& pieces, const Buffer& sum) {
  check_fingerprint("CudaOps::fingerprint", pieces, sum, device());
  std::map<int, std::vector<cuda::FingerprintDesc>> by_width;
  for (const FingerprintPiece& piece : pieces) {
    if (piece.data.empty()) continue;
    cuda::FingerprintDesc d{piece.data.data, piece.data.numel, fingerprint_key(piece.salt)};
    std::tie(d.row_len, d.ld) = strides_of(piece.data);
    by_width[static_cast<int>(dtype_size(piece.data.dtype))].push_back(d);
  }
  if (by_width.empty()) return;
  DeviceGuard guard(impl_->options.device);
  for (const auto& [width, descs] : by_width)
    cuda::fingerprint(width, descs, static_cast<unsigned long long*>(sum.data), impl_->current);
}

OwnedBuffer CudaOps::make_gate(const Buffer& flags) {
  DeviceGuard guard(impl_->options.device);
  OwnedBuffer gate = allocate(DType::kInt32, 1);
  cuda::any_nonzero(flags.as<const int>(), flags.numel, gate.get().as<int>(), impl_->current);
  return gate;
}

void CudaOps::prepare_pieces(const std::vector<PreparePiece>& pieces, const Buffer& gate) {
  DeviceGuard guard(impl_->options.device);
  // NOTE: momentum-only pieces are launched as their own element type with no wire.
  std::map<std::pair<DType, DType>, std::vector<cuda::PrepareDesc>> groups;
  for (const PreparePiece& piece : pieces) {
    require_supported(piece.grad.dtype);
    DMUON_CHECK(piece.wire.empty() || piece.wire.numel == piece.grad.numel, "CudaOps::prepare_pieces: a wire of ",
                piece.wire.numel, " elements for a piece of ", piece.grad.numel);
    const DType wire = piece.wire.empty() ? piece.grad.dtype : piece.wire.dtype;
    DMUON_CHECK(strides_of(piece.grad) == strides_of(piece.momentum) && !piece.wire.strided(),
                "CudaOps::prepare_pieces: gradient and momentum laid out differently, or a strided wire");
    cuda::PrepareDesc d{piece.grad.data, piece.momentum.data, piece.wire.empty() ? nullptr : piece.wire.data,
                        piece.grad.numel, cuda::make_rule(piece.rule.momentum, piece.rule.nesterov)};
    std::tie(d.row_len, d.ld) = strides_of(piece.grad);
    groups[{piece.grad.dtype, wire}].push_back(d);
  }
  for (const auto& [key, descs] : groups) cuda::prepare(key.first, key.second, descs, skip_of(gate), impl_->current);
}

int64_t CudaOps::ns_workspace_bytes(int64_t rows, int64_t cols, int64_t count, DType, ns::Algorithm algorithm) const {
  // NOTE: plus the scales and partial sums of the batch (a float per matrix and chunk).
  return static_cast<int64_t>(ns::cuda::workspace_bytes(algorithm, count, rows, cols)) +
         4 * count * (1 + cuda::num_chunks(rows * cols));
}

void CudaOps::orthogonalize(const NsBatchDesc& batch, const std::function<void(const NsView&, bool first)>& fill,
                            const std::function<void(const NsView&)>& consume) {
  DMUON_CHECK(batch.schedule != nullptr && batch.count >= 1 && batch.rows >= 1 && batch.cols >= 1,
              "CudaOps::orthogonalize: invalid batch [", batch.count, ", ", batch.rows, ", ", batch.cols, "]");
  require_supported(batch.param_dtype);
  DeviceGuard guard(impl_->options.device);
  const DType half = cuda_iterate_dtype(batch.schedule->algorithm);
  const ns::cuda::DType nsd = ns_dtype(half);
  const ns::cuda::SymMode mode = cuda::sym_mode_for(impl_->options.device, nsd, impl_->options.sym_kernel,
                                                    impl_->sym_path);
  const int64_t m = std::min(batch.rows, batch.cols);
  const bool transposed = batch.rows > batch.cols;
  bool first = true;
  impl_->graphs->run(
      *batch.schedule, nsd, mode, batch.count, batch.rows, batch.cols, impl_->current, batch.graphs,
      [&](void* x, int64_t ld, cudaStream_t) {
        fill(NsView{x, half, ld, m * ld, transposed}, first);
        first = false;
      },
      [&](const void* result, int64_t ld, cudaStream_t) {
        consume(NsView{const_cast<void*>(result), half, ld, m * ld, transposed});
      });
}

void CudaOps::prepare_to_iterate(const std::vector<LocalMatrix>& matrices, const Partials& partials,
                                 const NsBatchDesc& batch, const NsView& iterate, bool update_momentum,
                                 const Buffer& gate) {
  if (matrices.empty()) return;
  DeviceGuard guard(impl_->options.device);
  const cuda::IterateView it = view_of(iterate, batch);
  // Each matrix's scale from its check() partials, at its position in the batch.
  std::vector<int64_t> offset(static_cast<size_t>(batch.count), 0), count(static_cast<size_t>(batch.count), 0);
  bool in_order = matrices.size() == static_cast<size_t>(batch.count);
  for (size_t k = 0; k < matrices.size(); ++k) {
    const LocalMatrix& m = matrices[k];
    DMUON_CHECK(m.partial_idx >= 0 && static_cast<size_t>(m.partial_idx) < partials.offset.size(),
                "CudaOps::prepare_to_iterate: matrix ", m.matrix_idx, " has no partial sums from check()");
    DMUON_CHECK(m.matrix_idx >= 0 && m.matrix_idx < batch.count && m.grad.numel == batch.rows * batch.cols &&
                    m.grad.dtype == batch.param_dtype,
                "CudaOps::prepare_to_iterate: matrix ", m.matrix_idx, " of ", m.grad.numel, " ",
                dtype_name(m.grad.dtype), " elements in a batch of ", batch.count, " ", batch.rows, "x", batch.cols);
    offset[static_cast<size_t>(m.matrix_idx)] = partials.offset[static_cast<size_t>(m.partial_idx)];
    count[static_cast<size_t>(m.matrix_idx)] = partials.count[static_cast<size_t>(m.partial_idx)];
    DMUON_CHECK(strides_of(m.grad) == strides_of(m.momentum) && (!m.grad.strided() || m.grad.row_len == batch.cols),
                "CudaOps::prepare_to_iterate: matrix ", m.matrix_idx, " is strided in rows of ", m.grad.row_len,
                " for ", batch.cols, " columns, or its momentum is laid out differently");
    in_order = in_order && m.matrix_idx == static_cast<int64_t>(k) && !m.grad.strided();
  }
  OwnedBuffer scales = allocate(DType::kFloat32, batch.count);
  cuda::scales(partials.buffer.get().as<const float>(), offset, count, batch.schedule->eps, scales.get().as<float>(),
               impl_->current);
  if (batch.param_dtype == DType::kFloat32 && in_order) {
    // NOTE: the whole batch of float32 matrices in order: the single-GPU step's vectorized
    // pass (ns/cuda/matrix_list.h), which also writes the padding columns.
    std::vector<ns::cuda::StepMatrix> list;
    for (const LocalMatrix& m : matrices)
      list.push_back({m.grad.as<const float>(), m.momentum.as<float>()});
    const LocalMatrix& first = matrices.front();
    ns::cuda::normalized_update(ns_dtype(it.dtype), list.data(), batch.count, batch.rows, batch.cols,
                                {first.rule.momentum, first.rule.nesterov}, update_momentum, scales.get().as<float>(),
                                it.data, it.ld, impl_->current, skip_of(gate));
    return;
  }
  std::vector<cuda::LocalDesc> descs;
  for (const LocalMatrix& m : matrices)
    descs.push_back({m.grad.data, m.momentum.data, m.matrix_idx, cuda::make_rule(m.rule.momentum, m.rule.nesterov),
                     m.grad.strided() ? m.grad.ld : 0});
  cuda::local_to_iterate(batch.param_dtype, descs, update_momentum, scales.get().as<float>(), it, skip_of(gate),
                         impl_->current);
  cuda::zero_padding(it, batch.count, impl_->current);
}

void CudaOps::iterate_from_pieces(const std::vector<WirePiece>& pieces, const NsBatchDesc& batch,
                                  const NsView& iterate, const Buffer& gate) {
  if (pieces.empty()) return;
  DeviceGuard guard(impl_->options.device);
  const cuda::IterateView it = view_of(iterate, batch);
  const DType wire = pieces.front().wire.dtype;
  // Pieces in matrix order, so that each matrix's partial sums are consecutive.
  std::vector<size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return pieces[a].matrix_idx < pieces[b].matrix_idx; });
  std::vector<int64_t> offset(static_cast<size_t>(batch.count), 0), count(static_cast<size_t>(batch.count), 0);
  std::vector<cuda::WireDesc> descs;
  int64_t total = 0;
  for (size_t k : order) {
    const WirePiece& p = pieces[k];
    check_batch_rows("CudaOps::iterate_from_pieces", batch, p.matrix_idx, p.row_begin, p.row_count, p.wire.numel,
                     p.col_begin, p.col_count);
    const auto [c0, nc] = piece_cols(batch, p.col_begin, p.col_count);
    DMUON_CHECK(p.wire.dtype == wire, "CudaOps::iterate_from_pieces: pieces of ", dtype_name(wire), " and ",
                dtype_name(p.wire.dtype));
    const size_t m = static_cast<size_t>(p.matrix_idx);
    if (count[m] == 0) offset[m] = total;
    const int64_t chunks = cuda::num_chunks(p.wire.numel);
    descs.push_back({p.wire.data, p.matrix_idx, p.row_begin, p.row_count, total, c0, nc});
    count[m] += chunks;
    total += chunks;
  }
  OwnedBuffer partials = allocate(DType::kFloat32, std::max<int64_t>(1, total));
  OwnedBuffer scales = allocate(DType::kFloat32, batch.count);
  cuda::sum_squares(wire, descs, partials.get().as<float>(), impl_->current);
  cuda::scales(partials.get().as<const float>(), offset, count, batch.schedule->eps, scales.get().as<float>(),
               impl_->current);
  cuda::pieces_to_iterate(wire, descs, scales.get().as<const float>(), it, skip_of(gate), impl_->current);
  cuda::zero_padding(it, batch.count, impl_->current);
}

void CudaOps::result_to_pieces(const NsView& result, const NsBatchDesc& batch, const std::vector<WirePiece>& pieces) {
  if (pieces.empty()) return;
  DeviceGuard guard(impl_->options.device);
  std::map<DType, std::vector<cuda::WireDesc>> by_wire;
  for (const WirePiece& p : pieces) {
    check_batch_rows("CudaOps::result_to_pieces", batch, p.matrix_idx, p.row_begin, p.row_count, p.wire.numel,
                     p.col_begin, p.col_count);
    const auto [c0, nc] = piece_cols(batch, p.col_begin, p.col_count);
    by_wire[p.wire.dtype].push_back({p.wire.data, p.matrix_idx, p.row_begin, p.row_count, 0, c0, nc});
  }
  for (const auto& [wire, descs] : by_wire) cuda::result_to_pieces(wire, view_of(result, batch), descs, impl_->current);
}

void CudaOps::apply_result(const NsView& result, const NsBatchDesc& batch, const std::vector<ApplyPiece>& pieces,
                           const Buffer& gate, const Buffer& result_flags) {
  if (pieces.empty()) return;
  DeviceGuard guard(impl_->options.device);
  std::map<std::pair<DType, DType>, std::vector<cuda::ApplyDesc>> groups;  // (param, rounding) → pieces
  for (const ApplyPiece& p : pieces) {
    require_supported(p.param.dtype);
    check_batch_rows("CudaOps::apply_result", batch, p.matrix_idx, p.row_begin, p.row_count, p.param.numel,
                     p.col_begin, p.col_count);
    const auto [c0, nc] = piece_cols(batch, p.col_begin, p.col_count);
    DMUON_CHECK(p.flag_idx >= 0 && p.flag_idx < result_flags.numel, "CudaOps::apply_result: flag index ", p.flag_idx,
                " out of range");
    // NOTE: float64 marks "no rounding through the wire" (it is never a CUDA wire dtype).
    const DType rounding = p.round_through_wire ? p.wire_dtype : DType::kFloat64;
    DMUON_CHECK(!p.param.strided() || p.param.row_len == nc, "CudaOps::apply_result: a parameter in rows of ",
                p.param.row_len, " for ", nc, " columns");
    cuda::ApplyDesc d{p.param.data, nullptr, p.matrix_idx, p.row_begin, p.row_count, static_cast<float>(p.scale),
                      static_cast<float>(p.decay), p.flag_idx, c0, nc};
    std::tie(d.row_len, d.ld) = strides_of(p.param);
    groups[{p.param.dtype, rounding}].push_back(d);
  }
  for (const auto& [key, descs] : groups)
    cuda::apply_result(key.first, key.second, view_of(result, batch), descs, result_flags.as<int>(), skip_of(gate),
                       impl_->current);
}

OwnedBuffer CudaOps::normuon(NsView& result, const NsBatchDesc& batch, const std::vector<NormuonMatrix>& matrices,
                             const optim::NormuonRule& rule, const Buffer& gate, const Buffer& result_flags) {
  if (matrices.empty()) return {};
  DeviceGuard guard(impl_->options.device);
  std::vector<cuda::NormuonDesc> descs;
  for (const NormuonMatrix& m : matrices) {
    check_normuon_matrix("CudaOps::normuon", m, batch, result_flags);
    descs.push_back({m.v.as<float>(), m.matrix_idx, m.flag_idx});
  }
  // NOTE: stream-ordered scratch on the batch's stream; the caller keeps it until the
  // result's consumers, which read the row factors in it, are enqueued.
  const int64_t bytes = cuda::normuon_scratch_bytes(static_cast<int64_t>(descs.size()), batch.count, batch.rows);
  OwnedBuffer scratch = allocate(DType::kInt32, (bytes + 3) / 4);
  const cuda::RowScale scale = cuda::normuon(view_of(result, batch), batch.count, descs, rule.beta2, rule.eps,
                                             scratch.get().data, result_flags.as<int>(), skip_of(gate), impl_->current);
  result.row_scale = scale.factors;
  result.row_scaled = scale.scaled;
  return scratch;
}

void CudaOps::apply_pieces(const std::vector<ApplyPiece>& pieces, const Buffer& gate, const Buffer& result_flags) {
  if (pieces.empty()) return;
  DeviceGuard guard(impl_->options.device);
  // NOTE: flat: each piece as one row of its element count (its cols do not matter here).
  std::map<std::pair<DType, DType>, std::vector<cuda::ApplyDesc>> groups;  // (param, wire) → pieces
  for (const ApplyPiece& p : pieces) {
    require_supported(p.param.dtype);
    DMUON_CHECK(p.wire.numel == p.param.numel && p.flag_idx >= 0 && p.flag_idx < result_flags.numel,
                "CudaOps::apply_pieces: ", p.wire.numel, " wire elements for ", p.param.numel,
                " parameter elements (flag ", p.flag_idx, ")");
    DMUON_CHECK(!p.wire.strided(), "CudaOps::apply_pieces: a strided wire");
    cuda::ApplyDesc d{p.param.data, p.wire.data, 0, 0, p.param.numel, static_cast<float>(p.scale),
                      static_cast<float>(p.decay), p.flag_idx};
    std::tie(d.row_len, d.ld) = strides_of(p.param);
    groups[{p.param.dtype, p.wire.dtype}].push_back(d);
  }
  for (const auto& [key, descs] : groups)
    cuda::apply_wire(key.first, key.second, descs, 1, result_flags.as<int>(), skip_of(gate), impl_->current);
}

std::vector<int32_t> CudaOps::read_flags(const std::vector<Buffer>& buffers) {
  DeviceGuard guard(impl_->options.device);
  size_t total = 0;
  for (const Buffer& b : buffers) {
    DMUON_CHECK(b.dtype == DType::kInt32, "CudaOps::read_flags: expected int32 buffers");
    total += static_cast<size_t>(b.numel);
  }
  if (total > impl_->pinned_count) {
    if (impl_->pinned != nullptr) cudaFreeHost(impl_->pinned);
    impl_->pinned = nullptr;
    impl_->pinned_count = 0;
    DMUON_CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&impl_->pinned), total * sizeof(int32_t)));
    impl_->pinned_count = total;
  }
  size_t at = 0;
  for (const Buffer& b : buffers) {
    if (b.numel > 0)
      DMUON_CHECK_CUDA(cudaMemcpyAsync(impl_->pinned + at, b.data, static_cast<size_t>(b.bytes()),
                                       cudaMemcpyDeviceToHost, impl_->current));
    at += static_cast<size_t>(b.numel);
  }
  DMUON_CHECK_CUDA(cudaStreamSynchronize(impl_->current));
  return std::vector<int32_t>(impl_->pinned, impl_->pinned + total);
}

void CudaOps::synchronize() {
  DeviceGuard guard(impl_->options.device);
  DMUON_CHECK_CUDA(cudaStreamSynchronize(impl_->current));
}

int64_t CudaOps::record_mark() {
  DeviceGuard guard(impl_->options.device);
  if (impl_->num_marks == impl_->marks.size()) {
    cudaEvent_t event = nullptr;
    DMUON_CHECK_CUDA(cudaEventCreate(&event));
    impl_->marks.push_back(event);
  }
  DMUON_CHECK_CUDA(cudaEventRecord(impl_->marks[impl_->num_marks], impl_->current));
  return static_cast<int64_t>(impl_->num_marks++);
}

double CudaOps::mark_seconds(int64_t from, int64_t to) {
  DeviceGuard guard(impl_->options.device);
  for (int64_t id : {from, to})
    DMUON_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->num_marks, "CudaOps::mark_seconds: mark ", id,
                " was not recorded (", impl_->num_marks, " since clear_marks())");
  DMUON_CHECK_CUDA(cudaEventSynchronize(impl_->marks[static_cast<size_t>(to)]));
  float ms = 0.0f;
  DMUON_CHECK_CUDA(cudaEventElapsedTime(&ms, impl_->marks[static_cast<size_t>(from)],
                                        impl_->marks[static_cast<size_t>(to)]));
  return static_cast<double>(ms) * 1e-3;
}

void CudaOps::clear_marks() { impl_->num_marks = 0; }

MeasurementStore CudaOps::measurement_store() const {
  DeviceGuard guard(impl_->options.device);
  ns::cuda::Autotuner& tuner = ns::cuda::Autotuner::instance();
  return {tuner.cache_path(), tuner.environment()};
}

int CudaOps::run_on_streams(const std::vector<int>& stream_of, const std::function<void(size_t)>& run) {
  DeviceGuard guard(impl_->options.device);
  struct Restore {
    Impl& impl;
    ~Restore() { impl.current = impl.main; }
  } restore{*impl_};
  return impl_->streams->run(stream_of, impl_->main, [&](size_t k, cudaStream_t stream) {
    impl_->current = stream;
    run(k);
  });
}

}  // namespace dmuon::step
