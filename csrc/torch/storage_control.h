// dmuon/torch/storage_control.h — freeing and re-allocating a tensor's storage in place.
//
// The weight-ownership mode keeps one persistent compute tensor per owned matrix. Autograd
// saves that tensor in forward; between uses its storage is released (size 0) and later
// re-allocated and refilled, so the tensor object, its shape and its version counter never
// change (the same trick FSDP uses). Writes go through an alias that shares the storage but
// has its own version counter, so autograd's saved-tensor check still passes.
#pragma once

#include <ATen/ATen.h>

namespace dmuon::torch_adapter {

/// Whether `tensor`'s storage currently holds its bytes.
bool storage_is_allocated(const at::Tensor& tensor);

/// Allocates the bytes of `tensor` (contiguous, storage offset 0) if they were freed.
void allocate_storage(const at::Tensor& tensor);

/// Returns the bytes of `tensor`'s storage to its allocator (the tensor keeps its shape).
void free_storage(const at::Tensor& tensor);

/// A tensor over the same storage, shape and strides with its own version counter.
at::Tensor storage_alias(const at::Tensor& tensor);

}  // namespace dmuon::torch_adapter
