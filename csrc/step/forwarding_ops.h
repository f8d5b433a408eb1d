// dmuon/step/forwarding_ops.h — a DeviceOps that passes every call to another: the base of
// decorators that change some answers or passes (the torch adapter's float64 ops, tests
// that watch or break a pass).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "step/device_ops.h"

namespace dmuon::step {

/// Every call to `inner` (which must outlive it).
class ForwardingOps : public DeviceOps {
 public:
  explicit ForwardingOps(DeviceOps& inner) : inner_(inner) {}
  Device device() const override { return inner_.device(); }
  bool supports(DType dtype, std::string* why) const override { return inner_.supports(dtype, why); }
  bool strided_pieces(DType dtype) const override { return inner_.strided_pieces(dtype); }
  OwnedBuffer allocate(DType dtype, int64_t numel) override { return inner_.allocate(dtype, numel); }
  void fill_zero(const Buffer& b) override { inner_.fill_zero(b); }
  void fill_synthetic(const Buffer& b, uint64_t seed) override { inner_.fill_synthetic(b, seed); }
  void copy(const std::vector<CopyPiece>& pieces) override { inner_.copy(pieces); }
  void sum_into(const Buffer& src, int64_t num_parts, int64_t part_stride, const Buffer& dst, double scale, bool accumulate) override {
    inner_.sum_into(src, num_parts, part_stride, dst, scale, accumulate);
  }
  Partials check(const std::vector<CheckPiece>& pieces, const Buffer& flags) override {
    return inner_.check(pieces, flags);
  }
  void fingerprint(const std::vector<FingerprintPiece>& pieces, const Buffer& sum) override {
    inner_.fingerprint(pieces, sum);
  }
  OwnedBuffer make_gate(const Buffer& flags) override { return inner_.make_gate(flags); }
  void prepare_pieces(const std::vector<PreparePiece>& pieces, const Buffer& gate) override {
    inner_.prepare_pieces(pieces, gate);
  }
  int64_t ns_workspace_bytes(int64_t rows, int64_t cols, int64_t count, DType dtype,
                             ns::Algorithm algorithm) const override {
    return inner_.ns_workspace_bytes(rows, cols, count, dtype, algorithm);
  }
  void orthogonalize(const NsBatchDesc& batch, const std::function<void(const NsView&, bool)>& fill,
                     const std::function<void(const NsView&)>& consume) override {
    inner_.orthogonalize(batch, fill, consume);
  }
  void prepare_to_iterate(const std::vector<LocalMatrix>& m, const Partials& partials,
                          const NsBatchDesc& batch, const NsView& it, bool update,
                          const Buffer& gate) override {
    inner_.prepare_to_iterate(m, partials, batch, it, update, gate);
  }
  void iterate_from_pieces(const std::vector<WirePiece>& pieces, const NsBatchDesc& batch,
                           const NsView& it, const Buffer& gate) override {
    inner_.iterate_from_pieces(pieces, batch, it, gate);
  }
  void result_to_pieces(const NsView& r, const NsBatchDesc& batch,
                        const std::vector<WirePiece>& pieces) override {
    inner_.result_to_pieces(r, batch, pieces);
  }
  void apply_result(const NsView& r, const NsBatchDesc& batch, const std::vector<ApplyPiece>& pieces,
                    const Buffer& gate, const Buffer& flags) override {
    inner_.apply_result(r, batch, pieces, gate, flags);
  }
  void apply_pieces(const std::vector<ApplyPiece>& pieces, const Buffer& gate,
                    const Buffer& flags) override {
    inner_.apply_pieces(pieces, gate, flags);
  }
  OwnedBuffer normuon(NsView& r, const NsBatchDesc& batch, const std::vector<NormuonMatrix>& m,
                      const optim::NormuonRule& rule, const Buffer& gate, const Buffer& flags) override {
    return inner_.normuon(r, batch, m, rule, gate, flags);
  }
  std::vector<int32_t> read_flags(const std::vector<Buffer>& buffers) override {
    return inner_.read_flags(buffers);
  }
  void synchronize() override { inner_.synchronize(); }
  bool device_marks() const override { return inner_.device_marks(); }
  int64_t record_mark() override { return inner_.record_mark(); }
  double mark_seconds(int64_t from, int64_t to) override { return inner_.mark_seconds(from, to); }
  void clear_marks() override { inner_.clear_marks(); }
  MeasurementStore measurement_store() const override { return inner_.measurement_store(); }
  int run_on_streams(const std::vector<int>& stream_of, const std::function<void(size_t)>& run) override {
    return inner_.run_on_streams(stream_of, run);
  }

 protected:
  DeviceOps& inner_;  // NOTE: not owned
};

}  // namespace dmuon::step
