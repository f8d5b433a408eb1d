// dmuon/step/cpu/cpu_ops.h — DeviceOps on the CPU.
//
// Parameters of float32 and float64 iterate in their own precision through
// ns/cpu/cpu_backend.h's orthogonalize_cpu; bfloat16 and float16 parameters compute in
// float32 with the momentum buffer rounded to the parameter dtype after its lerp and U
// rounded to it before the wire or the iterate, as torch's _foreach_lerp_ on such tensors
// does (float arithmetic, one rounding per result). The iterate holds U itself (not yet
// normalized): orthogonalize_cpu divides by max(‖U‖_F, eps) as its first step, so the
// check's partial sums are not needed here. A matrix whose iterate is not finite (a wire
// that overflowed) gets a NaN result, which apply refuses and flags. Every pass that
// computes reads and writes subnormals as zero (cpu/flush_denormals.h), on the pool's
// threads too.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ns/cpu/cpu_backend.h"
#include "step/device_ops.h"

namespace dmuon::step {

struct CpuOpsOptions {
  /// Parallelism of the NS batches (matrices of a batch in parallel chunks).
  ns::ParallelFor parallel_for = ns::serial_for;
  /// Fill every allocation with NaN bit patterns (tests: nothing may read memory it did
  /// not write).
  bool poison_allocations = false;
};

class CpuOps : public DeviceOps {
 public:
  explicit CpuOps(CpuOpsOptions options = {});

  Device device() const override { return Device{DeviceKind::kCpu, 0}; }
  bool strided_pieces(DType) const override { return true; }
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
  void apply_pieces(const std::vector<ApplyPiece>& pieces, const Buffer& gate, const Buffer& result_flags) override;
  /// In place (nothing left for the consumers).
  OwnedBuffer normuon(NsView& result, const NsBatchDesc& batch, const std::vector<NormuonMatrix>& matrices,
                      const optim::NormuonRule& rule, const Buffer& gate, const Buffer& result_flags) override;

  std::vector<int32_t> read_flags(const std::vector<Buffer>& buffers) override;
  void synchronize() override {}
  int run_on_streams(const std::vector<int>& stream_of, const std::function<void(size_t)>& run) override;

 private:
  CpuOpsOptions options_;
};

/// The element type an NS batch of `param_dtype` parameters iterates in on the CPU:
/// float64 for float64 parameters, float32 for every other.
DType cpu_iterate_dtype(DType param_dtype);

}  // namespace dmuon::step
