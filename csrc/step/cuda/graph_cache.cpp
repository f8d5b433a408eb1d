// dmuon/step/cuda/graph_cache.cpp — eager first run, capture, replay.
#include "step/cuda/graph_cache.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/check.h"
#include "ns/cuda/autotune.h"
#include "ns/cuda/cuda_check.h"

namespace dmuon::step::cuda {

// One cached problem: once captured, its graph (on its stream's workspace of `generation`).
struct GraphCache::Entry {
  int calls = 0;
  bool capture_failed = false;
  cudaGraphExec_t exec = nullptr;
  uint64_t generation = 0;
  void* result = nullptr;
  ~Entry() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
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

GraphCache::GraphCache(Allocator& allocator, size_t budget_bytes) : workspaces_(allocator, budget_bytes) {}

GraphCache::~GraphCache() {
  entries_.clear();
  if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
}

std::vector<int64_t> GraphCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {static_cast<int64_t>(entries_.size()), num_captures_, num_replays_,
          static_cast<int64_t>(workspaces_.kept_bytes())};
}

// NOTE: captured on a private non-blocking stream: the caller's may be the legacy default
// stream, which cannot capture (cudaErrorStreamCaptureUnsupported: every graph test failed
// so on the H200); capturing runs nothing, and the graph is launched on the
// caller's stream, in its order.
bool GraphCache::capture(Entry& entry, const ns::Schedule& schedule, ns::cuda::DType dtype, ns::cuda::SymMode mode,
                         int64_t count, int64_t rows, int64_t cols, void* workspace, size_t bytes) {
  if (capture_stream_ == nullptr) DMUON_CHECK_CUDA(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  if (cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  void* result = nullptr;
  bool ok = true;
  try {
    result = ns::cuda::orthogonalize_iterate(schedule, dtype, mode, count, rows, cols, workspace, bytes,
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
  // NOTE: the workspace is the stream's kept one, or (no graphs, a capture under way, past
  // the budget) one of this run's own, released after it.
  std::unique_lock<std::mutex> lock(mutex_);
  const StreamWorkspaces::Lease ws = workspaces_.take(stream, bytes, graphs && !ns::cuda::stream_is_capturing(stream));
  if (!ws.kept()) {
    lock.unlock();
    eager(ws.data());
    return;
  }
  const std::string key = problem_key(schedule, dtype, mode, count, rows, cols, stream);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; });
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxProblems) entries_.pop_back();
    entries_.emplace_front(key, std::make_unique<Entry>());
  } else if (it != entries_.begin()) {
    entries_.splice(entries_.begin(), entries_, it);
  }
  Entry& entry = *entries_.front().second;
  // NOTE: the first call runs eagerly (it tunes the configurations, which synchronizes);
  // the second captures; later ones replay. A graph of an older workspace (the stream's
  // grew since) is captured again.
  if (entry.calls++ == 0 || entry.capture_failed) {
    eager(ws.data());
    return;
  }
  prepare(ns::cuda::iterate_buffer(schedule, count, rows, cols, ws.data(), bytes), ld, stream);
  if (entry.exec != nullptr && entry.generation != ws.generation()) {
    cudaGraphExecDestroy(entry.exec);
    entry.exec = nullptr;
  }
  if (entry.exec == nullptr) {
    if (!capture(entry, schedule, dtype, mode, count, rows, cols, ws.data(), bytes)) {
      entry.capture_failed = true;
      static bool warned = false;
      if (!warned) {
        warned = true;
        std::fprintf(stderr, "dmuon: CUDA-graph capture of the Newton-Schulz iteration failed; running it eagerly\n");
      }
      finish(ns::cuda::orthogonalize_iterate(schedule, dtype, mode, count, rows, cols, ws.data(), bytes, stream), ld,
             stream);
      return;
    }
    entry.generation = ws.generation();
    ++num_captures_;
  }
  DMUON_CHECK_CUDA(cudaGraphLaunch(entry.exec, stream));
  ++num_replays_;
  finish(entry.result, ld, stream);
}

}  // namespace dmuon::step::cuda
