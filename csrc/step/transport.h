// dmuon/step/transport.h — how pieces reach their owners and results come back: the one
// small interface between the step engine and a collective library (c10d in the torch
// adapter, threads of one process in the GoogleTests).
//
// Every rank calls the same collectives in the same order (the engine decides from facts
// every rank shares). A collective that fails throws dmuon::Error naming `what` and the
// rank; a transport must never leave the other ranks waiting on a rank that has thrown.
// A transport spans one group of ranks: a mesh's axes (the weight-ownership mode's shard
// rows and replica columns) are transports of their own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "step/types.h"

namespace dmuon::step {

enum class ReduceOp { kSum, kMax };

/// One collective in flight.
class Pending {
 public:
  virtual ~Pending() = default;
  /// GPU: the ops' stream waits for it; CPU: blocks until it is complete. Throws naming it.
  virtual void wait() = 0;
  /// Whether wait() returns without blocking the host: the collective completed (CPU), or
  /// the device orders it (GPU: wait() only makes a stream wait). Never blocks, never throws.
  virtual bool ready() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// False where the backend moves no data (torch's fake process group):
  /// receive buffers keep what the engine wrote there (it zero-fills them first), and
  /// reductions return this rank's values as if every rank behaved like this one.
  virtual bool moves_data() const { return true; }
  /// send_counts[d] consecutive elements of `send` go to rank d; recv_counts[s] elements
  /// from rank s land consecutively in `recv`. Both buffers stay alive until wait() returns.
  virtual std::unique_ptr<Pending> all_to_all(const Buffer& send, const std::vector<int64_t>& send_counts,
                                              const Buffer& recv, const std::vector<int64_t>& recv_counts,
                                              const std::string& what) = 0;
  /// `buffer` of rank `root` into `buffer` of every rank (same dtype and size everywhere);
  /// the buffer stays alive until wait() returns.
  virtual std::unique_ptr<Pending> broadcast_buffer(const Buffer& buffer, int root, const std::string& what) = 0;
  /// Element-wise over every rank, small host integer vectors; blocking.
  virtual std::vector<int64_t> all_reduce(const std::vector<int64_t>& local, ReduceOp op, const std::string& what) = 0;

  // Texts, through all_reduce (transport.cpp); where nothing moves, this rank's own text.
  /// Rank 0's text on every rank (a plan); blocking.
  std::string broadcast(const std::string& text, const std::string& what);
  /// Every rank's text, by rank (what a failed agreement names); blocking.
  std::vector<std::string> all_gather(const std::string& text, const std::string& what);
};

}  // namespace dmuon::step
