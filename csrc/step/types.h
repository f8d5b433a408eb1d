// dmuon/step/types.h — the step engine's element types, devices and memory descriptors.
//
// The engine never touches element data: it routes descriptors (Buffer) between the
// transport and the device ops. A Buffer is a view (pointer, element type, element count,
// device); an OwnedBuffer also releases its memory when it dies (DeviceOps::allocate).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace dmuon::step {

/// Element type of a parameter, gradient, momentum buffer, wire or flag buffer.
enum class DType { kFloat32, kFloat64, kBFloat16, kFloat16, kInt32 };

/// Bytes of one element.
int64_t dtype_size(DType dtype);
/// "float32", "float64", "bfloat16", "float16", "int32".
const char* dtype_name(DType dtype);

/// Where memory lives.
enum class DeviceKind { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  ///< CUDA device ordinal (0 on the CPU)
  bool operator==(const Device& other) const { return kind == other.kind && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
};
/// "cpu" or "cuda:<index>".
std::string device_name(const Device& device);

/// "step <step_idx>": how every error and collective of a step names it.
inline std::string step_name(int64_t step_idx) { return "step " + std::to_string(step_idx); }

/// A view of `numel` contiguous elements of `dtype` at `data` on `device`, or, strided
/// (ld > row_len > 0), of `numel` elements in rows of `row_len`, consecutive rows `ld`
/// elements apart (element i at data + (i / row_len)·ld + i % row_len): a piece of a
/// column block in a rank's local tensor (step/items.h). Only the ops that say so
/// (DeviceOps::strided_pieces) take strided views. Empty views may hold a null pointer.
struct Buffer {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
  Device device{};
  int64_t row_len = 0, ld = 0;  ///< strided views only (else 0)

  bool empty() const { return numel == 0; }
  bool strided() const { return row_len > 0 && ld > row_len; }
  /// Elements from data to element i (i itself for a contiguous view).
  int64_t offset_of(int64_t i) const { return strided() ? (i / row_len) * ld + i % row_len : i; }
  int64_t bytes() const { return numel * dtype_size(dtype); }
  /// Elements [offset, offset + count) of this contiguous view; throws naming `what` when
  /// out of range or the view is strided.
  Buffer slice(int64_t offset, int64_t count, const char* what = "Buffer::slice") const;
  /// `num_rows` rows of `length` elements, `stride` apart, from element `offset` of this
  /// contiguous view (contiguous itself when stride == length or num_rows <= 1); throws naming
  /// `what` when they do not lie in it.
  Buffer rows(int64_t offset, int64_t num_rows, int64_t length, int64_t stride,
              const char* what = "Buffer::rows") const;
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

/// A Buffer that releases its memory when it dies (move-only).
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  OwnedBuffer(Buffer buffer, std::function<void(const Buffer&)> release)
      : buffer_(buffer), release_(std::move(release)) {}
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  OwnedBuffer(OwnedBuffer&& other) noexcept { *this = std::move(other); }
  OwnedBuffer& operator=(OwnedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      buffer_ = other.buffer_;
      release_ = std::move(other.release_);
      other.buffer_ = Buffer{};
      other.release_ = nullptr;
    }
    return *this;
  }
  ~OwnedBuffer() { reset(); }

  const Buffer& get() const { return buffer_; }
  /// Releases the memory now (the view becomes empty).
  void reset() {
    if (release_) release_(buffer_);
    release_ = nullptr;
    buffer_ = Buffer{};
  }

 private:
  Buffer buffer_{};
  std::function<void(const Buffer&)> release_;
};

}  // namespace dmuon::step
