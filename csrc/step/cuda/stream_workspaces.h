// dmuon/step/cuda/stream_workspaces.h — the Newton–Schulz workspaces the CUDA graph cache
// keeps: one per stream, shared by every NS problem run on that stream (host-only, no CUDA
// headers, so that the step's memory is tested on any machine: tests/cpp/test_step_memory.cpp).
//
// The runs of one stream are ordered: a run's result is consumed before the next run's
// iterate is written, so one workspace of the stream's largest problem serves them all. It
// grows when a larger problem comes (a new generation: graphs captured on the old one must
// be captured again) and is kept until the owner dies. What the streams keep stays within a
// budget in total; a run that would pass it gets memory of its own, released after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "step/cuda/allocator.h"

namespace dmuon::step::cuda {

class StreamWorkspaces {
 public:
  /// Workspace of one run: the stream's kept one, or memory of its own (released when the
  /// lease dies, in the order of its stream). Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    void* data() const { return data_; }
    /// Whether it is the stream's kept workspace (else memory of this run's own).
    bool kept() const { return owner_ == nullptr; }
    /// The kept workspace's generation (0 for memory of its own): a graph captured on an
    /// older generation of the stream points to released memory.
    uint64_t generation() const { return generation_; }

   private:
    friend class StreamWorkspaces;
    Allocator* owner_ = nullptr;  // set: data_ is this lease's own
    void* data_ = nullptr;
    size_t bytes_ = 0;
    void* stream_ = nullptr;
    uint64_t generation_ = 0;
  };

  StreamWorkspaces(Allocator& allocator, size_t budget_bytes);
  ~StreamWorkspaces();
  StreamWorkspaces(const StreamWorkspaces&) = delete;
  StreamWorkspaces& operator=(const StreamWorkspaces&) = delete;

  /// At least `bytes` for a run on `stream`: the stream's kept workspace where `keep` and
  /// the budget allows it (grown first where it is smaller), else memory of the run's own.
  Lease take(void* stream, size_t bytes, bool keep);
  /// Bytes of every stream's kept workspace.
  size_t kept_bytes() const { return kept_bytes_; }

 private:
  struct Kept {
    void* stream = nullptr;
    void* data = nullptr;
    size_t bytes = 0;
    uint64_t generation = 0;
  };
  Allocator& allocator_;
  size_t budget_bytes_;
  std::vector<Kept> kept_;
  size_t kept_bytes_ = 0;
  uint64_t next_generation_ = 1;
};

}  // namespace dmuon::step::cuda
