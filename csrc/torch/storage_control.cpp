// dmuon/torch/storage_control.cpp — storage release and re-allocation without new tensors.
#include "storage_control.h"

#include <c10/core/CPUAllocator.h>

#include "common/check.h"

namespace dmuon::torch_adapter {
namespace {

size_t bytes_of(const at::Tensor& tensor) {
  return static_cast<size_t>(tensor.numel()) * tensor.element_size();
}

void check_plain(const at::Tensor& tensor, const char* what) {
  DMUON_CHECK(tensor.defined() && tensor.is_contiguous() && tensor.storage_offset() == 0,
              what, ": needs a defined contiguous tensor at storage offset 0");
}

}  // namespace

bool storage_is_allocated(const at::Tensor& tensor) {
  return tensor.defined() && tensor.storage().nbytes() >= bytes_of(tensor) &&
         (bytes_of(tensor) == 0 || tensor.storage().data() != nullptr);
}

void allocate_storage(const at::Tensor& tensor) {
  check_plain(tensor, "allocate_storage");
  if (storage_is_allocated(tensor)) return;
  c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
  c10::Allocator* allocator = impl->allocator();
  if (allocator == nullptr) allocator = c10::GetAllocator(tensor.device().type());
  DMUON_CHECK(allocator != nullptr, "allocate_storage: no allocator for device ", tensor.device());
  const size_t bytes = bytes_of(tensor);
  impl->set_data_ptr_noswap(allocator->allocate(bytes));
  impl->set_nbytes(bytes);
}

void free_storage(const at::Tensor& tensor) {
  check_plain(tensor, "free_storage");
  c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
  if (impl->nbytes() == 0) return;
  c10::Allocator* allocator = impl->allocator();
  if (allocator == nullptr) allocator = c10::GetAllocator(tensor.device().type());
  impl->set_data_ptr_noswap(allocator->allocate(0));
  impl->set_nbytes(0);
}

at::Tensor storage_alias(const at::Tensor& tensor) {
  at::Tensor alias = at::empty({0}, tensor.options().requires_grad(false));
  alias.set_(tensor.storage(), tensor.storage_offset(), tensor.sizes(), tensor.strides());
  return alias;
}

}  // namespace dmuon::torch_adapter
