// dmuon/step/cuda/graph_cache.h — the Newton–Schulz run of one NS batch on CUDA: autotuned
// on its first run, captured into a CUDA graph on its second, replayed after (torch-free;
// the step's and torch.ops.dmuon_testing.orthogonalize's one path).
//
// A problem (stream, iterate dtype, symmetric mode, batch, shape, schedule) keeps its graph
// while it is cached (the least recently used dropped past kMaxProblems); its workspace is
// its stream's, shared with every problem run there (step/cuda/stream_workspaces.h), the
// kept workspaces bounded by `budget_bytes` in total. The iterate's preparation (which
// reads the caller's data) and the consumption of the result run outside the graph, on the
// same stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ns/cuda/cuda_backend.h"
#include "ns/schedule.h"
#include "step/cuda/allocator.h"
#include "step/cuda/stream_workspaces.h"

namespace dmuon::step::cuda {

/// Consumes the 16-bit result of a run (wide orientation, leading dimension ld, batch
/// stride min(rows, cols)·ld), on `stream`, before its memory is reused.
using FinishResult = std::function<void(const void* result, int64_t ld, cudaStream_t stream)>;

class GraphCache {
 public:
  /// On the current CUDA device.
  GraphCache(Allocator& allocator, size_t budget_bytes);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  /// One NS run of `count` rows×cols matrices on `stream`. graphs = false: always eager
  /// (a workspace of its own, released after).
  void run(const ns::Schedule& schedule, ns::cuda::DType dtype, ns::cuda::SymMode mode, int64_t count, int64_t rows,
           int64_t cols, cudaStream_t stream, bool graphs, const ns::cuda::PrepareIterate& prepare,
           const FinishResult& finish);

  /// [cached problems, captures, replays, bytes of kept workspaces].
  std::vector<int64_t> stats() const;

  /// Problems whose graphs are kept.
  /// NOTE: a graph holds no workspace of its own; a model's step has one problem per NS
  /// batch size and stream (8 for Qwen2.5-1.5B: 5 batch sizes, 3 of them on both streams);
  /// the bound is for a process that orthogonalizes many shapes (torch.ops.dmuon_testing.orthogonalize).
  static constexpr size_t kMaxProblems = 256;

 private:
  struct Entry;
  bool capture(Entry& entry, const ns::Schedule& schedule, ns::cuda::DType dtype, ns::cuda::SymMode mode,
               int64_t count, int64_t rows, int64_t cols, void* workspace, size_t bytes);

  cudaStream_t capture_stream_ = nullptr;
  mutable std::mutex mutex_;
  StreamWorkspaces workspaces_;
  std::list<std::pair<std::string, std::unique_ptr<Entry>>> entries_;  // most recent first
  int64_t num_captures_ = 0, num_replays_ = 0;
};

}  // namespace dmuon::step::cuda
