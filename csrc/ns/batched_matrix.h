// dmuon/ns/batched_matrix.h — a non-owning view of `batch` row-major matrices.
#pragma once

#include <cstdint>

namespace dmuon::ns {

/// `batch` matrices of rows×cols, row-major with leading dimension `ld`, the next
/// matrix `batch_stride` elements further. Owns nothing.
template <typename T>
struct BatchedMatrix {
  T* data = nullptr;
  int64_t batch = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  int64_t batch_stride = 0;

  T* matrix(int64_t batch_idx) const { return data + batch_idx * batch_stride; }
};

/// A densely packed batch: ld = cols, batch_stride = rows·cols.
template <typename T>
BatchedMatrix<T> packed_batch(T* data, int64_t batch, int64_t rows, int64_t cols) {
  return BatchedMatrix<T>{data, batch, rows, cols, cols, rows * cols};
}

}  // namespace dmuon::ns
