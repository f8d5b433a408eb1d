// tests/cpp/loopback_transport.h — transports without a collective library, for the tests
// only (the product's transport is the torch adapter's c10d one):
//   LoopbackWorld    N ranks as threads of one process meeting at a shared rendezvous
//                    (every collective of step::Transport), so GoogleTest can run worlds of
//                    1–4; the axes of a mesh are LoopbackWorlds of their own;
//   NoDataTransport  rank r of a world of D that moves nothing (the model of torch's fake
//                    process group).
// A rank that throws, calls a different collective than the others, or finishes while the
// others wait for it fails every rank's pending and later collectives with a named error:
// a broken rank never leaves the others hanging.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "step/transport.h"

namespace dmuon::testing {

using step::Buffer;
using step::Pending;
using step::ReduceOp;
using step::Transport;

struct LoopbackOptions {
  /// Copies `bytes` between two ranks' buffers (default std::memcpy; a GPU test passes a
  /// device copy).
  std::function<void(void* dst, const void* src, size_t bytes)> copy;
  /// Runs before a collective's copies (a GPU test waits for the device there).
  std::function<void()> before_copy;
  /// all_to_all and broadcast_buffer move their data at the first wait() once every rank
  /// has arrived, not as the last rank arrives: as a library whose transfer may still run
  /// after a later collective completed. A rank that drops one unmoved fails the world.
  bool move_when_waited = false;
};

class LoopbackWorld {
 public:
  explicit LoopbackWorld(int world_size, LoopbackOptions options = {});
  ~LoopbackWorld();
  LoopbackWorld(const LoopbackWorld&) = delete;
  LoopbackWorld& operator=(const LoopbackWorld&) = delete;

  int world_size() const { return world_size_; }
  /// Rank `rank`'s transport (valid while the world lives).
  Transport& transport(int rank);
  /// Runs fn(rank) on one thread per rank and joins them. A rank that throws fails the
  /// rendezvous (every other rank's collectives throw naming it). Returns each rank's
  /// error message, "" where fn returned; where every rank returned but the world failed
  /// (a collective dropped before it completed), every rank's is that failure.
  std::vector<std::string> run(const std::function<void(int rank)>& fn);
  /// Fails every pending and later collective: rank `rank` failed with `why`.
  void abort(int rank, const std::string& why);
  /// Collectives completed so far (tests).
  int64_t num_completed() const;

 private:
  class RankTransport;
  class AsyncPending;
  struct Slot;
  enum class Kind { kAllToAll, kAllReduce, kBroadcastBuffer };

  // The slot of this rank's next collective, checked against what the other ranks called.
  Slot& arrive(int rank, Kind kind, const std::string& what, std::unique_lock<std::mutex>& lock, int64_t* seq);
  // Blocks until slot `seq` completes (`move`: or every rank arrived, then completes it);
  // throws the world's failure naming `what`.
  void await(int rank, int64_t seq, const std::string& what, std::unique_lock<std::mutex>& lock, bool move = false);
  // Run by the last rank to arrive: the collective's data movement or reduction.
  void complete(Slot& slot);
  void fail_locked(const std::string& why);
  void finish(int rank);

  int world_size_;
  LoopbackOptions options_;
  std::vector<std::unique_ptr<RankTransport>> transports_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, std::unique_ptr<Slot>> slots_;  // by sequence number
  std::vector<int64_t> next_seq_;                   // [rank]
  std::vector<bool> finished_;                      // [rank] fn returned or threw
  std::string failure_;
  int64_t num_completed_ = 0;
};

/// Rank `rank` of a world of `world_size` whose collectives move nothing: all_to_all and
/// broadcast_buffer leave the buffers as they are, all_reduce returns local·world (sum) or
/// local (max).
class NoDataTransport : public Transport {
 public:
  NoDataTransport(int rank, int world_size);
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  bool moves_data() const override { return false; }
  std::unique_ptr<Pending> all_to_all(const Buffer& send, const std::vector<int64_t>& send_counts, const Buffer& recv,
                                      const std::vector<int64_t>& recv_counts, const std::string& what) override;
  std::unique_ptr<Pending> broadcast_buffer(const Buffer& buffer, int root, const std::string& what) override;
  std::vector<int64_t> all_reduce(const std::vector<int64_t>& local, ReduceOp op, const std::string& what) override;

 private:
  int rank_, world_size_;
};

}  // namespace dmuon::testing
