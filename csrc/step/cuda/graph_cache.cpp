// dmuon/step/cuda/graph_cache.cpp — eager first run, capture, replay.
#include "step/cuda/graph_cache.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/check.h"
#include "ns/cuda/autotune.h"
#include "ns/cuda/cuda_check.h"

namespace dmuon::step::cuda {

// One cached problem: its workspace and, once captured, its graph.
struct GraphCache::Entry {
  Allocator* allocator = nullptr;
  void* workspace = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;  // where the workspace was last used (for its release)
  int calls = 0;
  bool capture_failed = false;
  cudaGraphExec_t exec = nullptr;
  void* result = nullptr;
  ~Entry() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (workspace != nullptr) allocator->release(workspace, bytes, stream);
  }
};

namespace {

std::string problem_key(const ns::Schedule& schedule, ns::cuda::DType dtype, ns::cuda::SymMode mode, int64_t count,
                        int64_t rows, int64_t cols, cudaStream_t stream) {
  std::ostringstream key;
  key.precision(17);
  key << reinterpret_cast<uintptr_t>(stream) << "|" << static_cast<int>(dtype) << "|" << static_cast<int>(mode) << "|"
      << count << "x" << rows << "x" << cols << "|" << ns::algorithm_name(schedule.algorithm) << "|" << schedule.eps;
  for (const auto& c : schedule.steps) key << "|" << c.a << "," << c.b << "," << c.c;
  key << "|r";
  for (int r : schedule.restart_after) key << r << ",";
  return key.str();
}

}  // namespace

GraphCache::GraphCache(Allocator& allocator, size_t budget_bytes) : allocator_(allocator), budget_bytes_(budget_bytes) {}

GraphCache::~GraphCache() {
  entries_.clear();
  if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
}

std::vector<int64_t> GraphCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {static_cast<int64_t>(entries_.size()), num_captures_, num_replays_, static_cast<int64_t>(total_bytes_)};
}

// NOTE: captured on a private non-blocking stream: the caller's may be the legacy default
// stream, which cannot capture (cudaErrorStreamCaptureUnsupported: every graph test failed
// so on the H200); capturing runs nothing, and the graph is launched on the
// caller's stream, in its order.
bool GraphCache::capture(Entry& entry, const ns::Schedule& schedule, ns::cuda::DType dtype, ns::cuda::SymMode mode,
                         int64_t count, int64_t rows, int64_t cols) {
  if (capture_stream_ == nullptr) DMUON_CHECK_CUDA(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  if (cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  void* result = nullptr;
  bool ok = true;
  try {
    result = ns::cuda::orthogonalize_iterate(schedule, dtype, mode, count, rows, cols, entry.workspace, entry.bytes,
                                             capture_stream_);
  } catch (const std::exception&) {
    ok = false;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(capture_stream_, &graph);
  ok = ok && end == cudaSuccess && graph != nullptr;
  if (ok) ok = cudaGraphInstantiate(&entry.exec, graph, 0) == cudaSuccess;
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!ok) {
    cudaGetLastError();
    entry.exec = nullptr;
    return false;
  }
  entry.result = result;
  return true;
}

void GraphCache::run(const ns::Schedule& schedule, ns::cuda::DType dtype, ns::cuda::SymMode mode, int64_t count,
                     int64_t rows, int64_t cols, cudaStream_t stream, bool graphs,
                     const ns::cuda::PrepareIterate& prepare, const FinishResult& finish) {
  DMUON_CHECK(count >= 1 && rows >= 1 && cols >= 1, "GraphCache::run: invalid batch [", count, ", ", rows, ", ", cols,
              "]");
  const size_t bytes = ns::cuda::workspace_bytes(schedule.algorithm, count, rows, cols);
  const int64_t ld = ns::cuda::padded_ld(std::max(rows, cols));
  auto eager = [&](void* workspace) {
    finish(ns::cuda::orthogonalize_prepared(schedule, dtype, mode, count, rows, cols, workspace, bytes, stream, prepare),
           ld, stream);
  };
  if (!graphs || bytes > budget_bytes_ || ns::cuda::stream_is_capturing(stream)) {
    void* workspace = allocator_.allocate(bytes, stream);
    struct Release {
      Allocator& allocator;
      void* ptr;
      size_t bytes;
      cudaStream_t stream;
      ~Release() { allocator.release(ptr, bytes, stream); }
    } release{allocator_, workspace, bytes, stream};
    eager(workspace);
    return;
  }

  std::lock_guard<std::mutex> lock(mutex_);
  const std::string key = problem_key(schedule, dtype, mode, count, rows, cols, stream);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; });
  if (it == entries_.end()) {
    // Make room (least recently used last), then keep a workspace for this problem.
    while (!entries_.empty() && total_bytes_ + bytes > budget_bytes_) {
      total_bytes_ -= entries_.back().second->bytes;
      entries_.pop_back();
    }
    auto entry = std::make_unique<Entry>();
    entry->allocator = &allocator_;
    entry->bytes = bytes;
    entry->stream = stream;
    entry->workspace = allocator_.allocate(bytes, stream);
    total_bytes_ += bytes;
    entries_.emplace_front(key, std::move(entry));
  } else if (it != entries_.begin()) {
    entries_.splice(entries_.begin(), entries_, it);
  }
  Entry& entry = *entries_.front().second;
  // NOTE: the first call runs eagerly (it tunes the configurations, which synchronizes);
  // the second captures; later ones replay.
  if (entry.calls++ == 0 || entry.capture_failed) {
    eager(entry.workspace);
    return;
  }
  prepare(ns::cuda::iterate_buffer(schedule, count, rows, cols, entry.workspace, bytes), ld, stream);
  if (entry.exec == nullptr) {
    if (!capture(entry, schedule, dtype, mode, count, rows, cols)) {
      entry.capture_failed = true;
      static bool warned = false;
      if (!warned) {
        warned = true;
        std::fprintf(stderr, "dmuon: CUDA-graph capture of the Newton-Schulz iteration failed; running it eagerly\n");
      }
      finish(ns::cuda::orthogonalize_iterate(schedule, dtype, mode, count, rows, cols, entry.workspace, bytes, stream),
             ld, stream);
      return;
    }
    ++num_captures_;
  }
  DMUON_CHECK_CUDA(cudaGraphLaunch(entry.exec, stream));
  ++num_replays_;
  finish(entry.result, ld, stream);
}

}  // namespace dmuon::step::cuda
