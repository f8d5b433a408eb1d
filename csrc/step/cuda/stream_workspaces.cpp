// dmuon/step/cuda/stream_workspaces.cpp — one kept workspace per stream, grown on demand.
#include "step/cuda/stream_workspaces.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace dmuon::step::cuda {

StreamWorkspaces::Lease& StreamWorkspaces::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->release(data_, bytes_, stream_);
    owner_ = other.owner_, data_ = other.data_, bytes_ = other.bytes_, stream_ = other.stream_;
    generation_ = other.generation_;
    other.owner_ = nullptr, other.data_ = nullptr;
  }
  return *this;
}

StreamWorkspaces::Lease::~Lease() {
  if (owner_ != nullptr) owner_->release(data_, bytes_, stream_);
}

StreamWorkspaces::StreamWorkspaces(Allocator& allocator, size_t budget_bytes)
    : allocator_(allocator), budget_bytes_(budget_bytes) {}

StreamWorkspaces::~StreamWorkspaces() {
  for (const Kept& k : kept_) allocator_.release(k.data, k.bytes, k.stream);
}

StreamWorkspaces::Lease StreamWorkspaces::take(void* stream, size_t bytes, bool keep) {
  DMUON_CHECK(bytes > 0, "StreamWorkspaces::take: a workspace of 0 bytes");
  Lease lease;
  lease.stream_ = stream;
  auto it = std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) { return k.stream == stream; });
  const size_t held = it == kept_.end() ? 0 : it->bytes;
  if (keep && held >= bytes) {
    lease.data_ = it->data, lease.bytes_ = it->bytes, lease.generation_ = it->generation;
    return lease;
  }
  if (keep && kept_bytes_ - held + bytes <= budget_bytes_) {
    // Grow: the smaller workspace is released in its stream's order, then the larger made.
    if (it != kept_.end()) {
      allocator_.release(it->data, it->bytes, stream);
      kept_bytes_ -= it->bytes;
      kept_.erase(it);
    }
    Kept grown{stream, allocator_.allocate(bytes, stream), bytes, next_generation_++};
    kept_.push_back(grown);
    kept_bytes_ += bytes;
    lease.data_ = grown.data, lease.bytes_ = bytes, lease.generation_ = grown.generation;
    return lease;
  }
  lease.data_ = allocator_.allocate(bytes, stream);
  lease.bytes_ = bytes;
  lease.owner_ = &allocator_;
  return lease;
}

}  // namespace dmuon::step::cuda
