// dmuon/step/device_ops.cpp — the argument check every DeviceOps shares, and what the
// device's ops support by default (their dtypes, no NorMuon pass, no device-time marks).
#include "step/device_ops.h"

#include "common/check.h"

namespace dmuon::step {

bool ops_support(DeviceKind device, DType dtype, std::string* reason) {
  auto refuse = [&](const std::string& why) {
    if (reason != nullptr) *reason = why;
    return false;
  };
  if (dtype == DType::kInt32) return refuse("int32 is not a floating-point type");
  // NOTE: the CUDA ops iterate in 16 bits and their fused passes are instantiated for
  // float32, bfloat16 and float16 parameters; a float64 parameter asks for float64
  // arithmetic, which the adapter's ATen Newton–Schulz gives it.
  if (device == DeviceKind::kCuda && dtype == DType::kFloat64)
    return refuse("float64 parameters are not supported by the CUDA step ops (they iterate in 16 bits); "
                  "the adapter's ATen Newton-Schulz steps them in float64");
  return true;
}

bool DeviceOps::supports(DType dtype, std::string* why) const { return ops_support(device().kind, dtype, why); }

OwnedBuffer DeviceOps::normuon(NsView& /*result*/, const NsBatchDesc& /*batch*/,
                               const std::vector<NormuonMatrix>& /*matrices*/, const optim::NormuonRule& /*rule*/,
                               const Buffer& /*gate*/, const Buffer& /*result_flags*/) {
  DMUON_FAIL("normuon=True is not supported by the step engine's ops on ", device_name(device()));
}

int64_t DeviceOps::record_mark() {
  DMUON_FAIL("device-time marks are not made by the step engine's ops on ", device_name(device()),
             " (device_marks() is false: time them on the host)");
}

double DeviceOps::mark_seconds(int64_t /*from*/, int64_t /*to*/) {
  DMUON_FAIL("device-time marks are not made by the step engine's ops on ", device_name(device()),
             " (device_marks() is false: time them on the host)");
}

MeasurementStore DeviceOps::measurement_store() const {
  return {"", {device_name(device()), "", "", DMUON_VERSION}};
}

void check_normuon_matrix(const char* what, const NormuonMatrix& m, const NsBatchDesc& batch,
                          const Buffer& result_flags) {
  DMUON_CHECK(m.matrix_idx >= 0 && m.matrix_idx < batch.count, what, ": matrix ", m.matrix_idx, " of a batch of ",
              batch.count);
  DMUON_CHECK(m.v.dtype == DType::kFloat32 && m.v.numel == batch.rows, what, ": v holds ", m.v.numel, " elements of ",
              dtype_name(m.v.dtype), " for ", batch.rows, " rows of float32");
  DMUON_CHECK(m.flag_idx >= 0 && m.flag_idx < result_flags.numel, what, ": flag index ", m.flag_idx, " out of range");
}

void check_sum_into(const char* what, const Buffer& src, int64_t num_parts, int64_t part_stride, const Buffer& dst) {
  DMUON_CHECK(num_parts >= 1 && part_stride >= dst.numel && src.numel >= (num_parts - 1) * part_stride + dst.numel &&
                  !src.strided() && !dst.strided() &&
                  (dst.numel == 0 || (src.data != nullptr && dst.data != nullptr)) && src.device == dst.device,
              what, ": ", num_parts, " parts of ", dst.numel, " elements ", part_stride, " apart on ",
              device_name(dst.device), " from ", src.numel, " contiguous elements on ", device_name(src.device));
}

void check_fingerprint(const char* what, const std::vector<FingerprintPiece>& pieces, const Buffer& sum,
                       const Device& device) {
  DMUON_CHECK(sum.dtype == DType::kInt32 && sum.numel == 2 && sum.data != nullptr && sum.device == device, what,
              ": the sum must be int32 [2] on ", device_name(device), ", not ", dtype_name(sum.dtype), " [", sum.numel,
              "] on ", device_name(sum.device));
  for (const FingerprintPiece& p : pieces) {
    const int64_t width = dtype_size(p.data.dtype);
    DMUON_CHECK((width == 2 || width == 4 || width == 8) && (p.data.empty() || (p.data.data != nullptr && p.data.device == device)),
                what, ": a piece of ", p.data.numel, " ", dtype_name(p.data.dtype), " on ", device_name(p.data.device),
                " (2, 4 or 8-byte elements on ", device_name(device), ")");
  }
}

void check_batch_rows(const char* what, const NsBatchDesc& batch, int64_t matrix_idx, int64_t row_begin,
                      int64_t row_count, int64_t numel, int64_t col_begin, int64_t col_count) {
  const auto [c0, nc] = piece_cols(batch, col_begin, col_count);
  DMUON_CHECK(matrix_idx >= 0 && matrix_idx < batch.count && row_begin >= 0 && row_count >= 0 &&
                  row_begin + row_count <= batch.rows && c0 >= 0 && nc >= 0 && c0 + nc <= batch.cols &&
                  numel == row_count * nc,
              what, ": rows [", row_begin, ", ", row_begin + row_count, ") x columns [", c0, ", ", c0 + nc,
              ") of matrix ", matrix_idx, " with ", numel, " elements, in a batch of ", batch.count, " ", batch.rows,
              "x", batch.cols);
}

}  // namespace dmuon::step
