// dmuon/step/cuda/cuda_ops.h — DeviceOps on one CUDA GPU (torch-free; this header needs no
// CUDA headers, so the engine's callers need none either).
//
// Every pass is a fused kernel over lists of row pieces (step/cuda/piece_kernels.h), the
// NS of a batch goes through the autotuned backend (ns/cuda/cuda_backend.h) with a CUDA-
// graph cache (step/cuda/graph_cache.h), NS batches of a stage may spread over side
// streams (step/cuda/stream_set.h), and memory comes from an Allocator (the adapter's:
// torch's caching allocator). Gram schedules iterate in float16, standard ones in
// bfloat16 (DESIGN.md §3). Parameters of float32, bfloat16 and float16; float64 ones are
// refused as ops_support says (step/device_ops.h: the adapter's ATen fallback).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "step/cuda/allocator.h"
#include "step/device_ops.h"

namespace dmuon::step {

struct CudaOpsOptions {
  int device = 0;
  /// The cudaStream_t every pass is enqueued on (the adapter: torch's current stream);
  /// null: a non-blocking stream of the ops' own.
  void* stream = nullptr;
  /// Device memory; null: cudaMallocAsync (cuda::make_async_allocator). Outlives the ops.
  cuda::Allocator* allocator = nullptr;
  /// Bound on the workspaces the graph cache keeps (the adapter reads DMUON_GRAPH_CACHE_MB).
  int64_t graph_cache_bytes = int64_t{8192} << 20;
  /// Symmetric products tuned among the sm_90a kernel (where it is built, the GPU is sm_90
  /// and its self-check passed), the portable products and dense cuBLASLt; false:
  /// dense cuBLASLt products, mirrored. DMUON_SYM_PATH forces one path.
  bool sym_kernel = true;
};

class CudaOps : public DeviceOps {
 public:
  explicit CudaOps(CudaOpsOptions options = {});
  ~CudaOps() override;

  /// The cudaStream_t the ops enqueue on (the transport orders its collectives into it).
  void* stream() const;
  /// The graph cache's [cached problems, captures, replays, bytes of kept workspaces].
  std::vector<int64_t> graph_stats() const;

  Device device() const override;
  /// Strided views (a column block's rows) of every dtype the CUDA step serves.
  bool strided_pieces(DType dtype) const override;
  OwnedBuffer allocate(DType dtype, int64_t numel) override;
  void fill_zero(const Buffer& buffer) override;
  void fill_synthetic(const Buffer& buffer, uint64_t seed) override;
  void copy(const std::vector<CopyPiece>& pieces) override;
  void sum_into(const Buffer& src, int64_t num_parts, int64_t part_stride, const Buffer& dst, double scale, bool accumulate) override;

  Partials check(const std::vector<CheckPiece>& pieces, const Buffer& flags) override;
  void fingerprint(const std::vector<FingerprintPiece>& pieces, const Buffer& sum) override;
  OwnedBuffer make_gate(const Buffer& flags) override;
  void prepare_pieces(const std::vector<PreparePiece>& pieces, const Buffer& gate) override;

  int64_t ns_workspace_bytes(int64_t rows, int64_t cols, int64_t count, DType param_dtype,
                             ns::Algorithm algorithm) const override;
  void orthogonalize(const NsBatchDesc& batch, const std::function<void(const NsView&, bool first)>& fill,
                     const std::function<void(const NsView&)>& consume) override;
  void prepare_to_iterate(const std::vector<LocalMatrix>& matrices, const Partials& partials,
                          const NsBatchDesc& batch, const NsView& iterate, bool update_momentum,
                          const Buffer& gate) override;
  void iterate_from_pieces(const std::vector<WirePiece>& pieces, const NsBatchDesc& batch, const NsView& iterate,
                           const Buffer& gate) override;
  void result_to_pieces(const NsView& result, const NsBatchDesc& batch, const std::vector<WirePiece>& pieces) override;
  void apply_result(const NsView& result, const NsBatchDesc& batch, const std::vector<ApplyPiece>& pieces,
                    const Buffer& gate, const Buffer& result_flags) override;
  /// Leaves the row factors on `result` for its consumers (step/cuda/normuon_kernels.h).
  OwnedBuffer normuon(NsView& result, const NsBatchDesc& batch, const std::vector<NormuonMatrix>& matrices,
                      const optim::NormuonRule& rule, const Buffer& gate, const Buffer& result_flags) override;
  void apply_pieces(const std::vector<ApplyPiece>& pieces, const Buffer& gate, const Buffer& result_flags) override;

  std::vector<int32_t> read_flags(const std::vector<Buffer>& buffers) override;
  void synchronize() override;
  /// CUDA events on the current stream (made once, reused).
  bool device_marks() const override { return true; }
  int64_t record_mark() override;
  double mark_seconds(int64_t from, int64_t to) override;
  void clear_marks() override;
  /// The autotuner's store and its environment: measured NS times are kept with the
  /// configurations they were measured with.
  MeasurementStore measurement_store() const override;
  int run_on_streams(const std::vector<int>& stream_of, const std::function<void(size_t)>& run) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The iterate element type of a schedule on CUDA: float16 for Gram NS, bfloat16 for
/// standard NS (DESIGN.md §3).
DType cuda_iterate_dtype(ns::Algorithm algorithm);

/// Whether this process sees a CUDA device (tests skip without one).
bool cuda_device_available();

}  // namespace dmuon::step
