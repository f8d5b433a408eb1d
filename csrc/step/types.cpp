// dmuon/step/types.cpp — element sizes and names, device names, Buffer slices.
#include "step/types.h"

#include "common/check.h"

namespace dmuon::step {

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kInt32: return 4;
  }
  DMUON_FAIL("unknown DType ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kInt32: return "int32";
  }
  return "unknown";
}

std::string device_name(const Device& device) {
  return device.kind == DeviceKind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(device.index);
}

Buffer Buffer::slice(int64_t offset, int64_t count, const char* what) const {
  DMUON_CHECK(!strided(), what, ": a slice of a strided view (rows of ", row_len, " elements, ", ld, " apart)");
  DMUON_CHECK(offset >= 0 && count >= 0 && offset + count <= numel, what, ": elements [", offset, ", ",
              offset + count, ") of a buffer of ", numel);
  Buffer out = *this;
  out.data = count == 0 ? nullptr : static_cast<char*>(data) + offset * dtype_size(dtype);
  out.numel = count;
  return out;
}

Buffer Buffer::rows(int64_t offset, int64_t num_rows, int64_t length, int64_t stride, const char* what) const {
  DMUON_CHECK(num_rows >= 0 && length >= 0 && stride >= length, what, ": ", num_rows, " rows of ", length,
              " elements, ", stride, " apart");
  if (num_rows <= 1 || stride == length || length == 0) return slice(offset, num_rows * length, what);
  Buffer out = slice(offset, (num_rows - 1) * stride + length, what);
  out.numel = num_rows * length;
  out.row_len = length;
  out.ld = stride;
  return out;
}

}  // namespace dmuon::step
