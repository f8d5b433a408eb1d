// tests/cpp/loopback_transport.cpp — the in-process rendezvous of LoopbackWorld and the
// transport that moves nothing.
#include "loopback_transport.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/check.h"

namespace dmuon::testing {

// One collective, by sequence number: what each rank brought, and its outcome.
struct LoopbackWorld::Slot {
  Kind kind = Kind::kAllReduce;
  std::string what;
  int first_rank = 0;
  int arrived = 0, departed = 0;
  bool done = false;
  // all_to_all
  std::vector<Buffer> send, recv;
  std::vector<std::vector<int64_t>> send_counts, recv_counts;
  // all_reduce
  ReduceOp op = ReduceOp::kSum;
  std::vector<std::vector<int64_t>> values;
  std::vector<int64_t> reduced;
  // broadcast_buffer (recv[r] every rank's buffer)
  int root = 0;

  explicit Slot(int world)
      : send(world), recv(world), send_counts(world), recv_counts(world), values(world) {}
};

namespace {

const char* kind_name(int kind) {
  static const char* names[] = {"all_to_all", "all_reduce", "broadcast_buffer"};
  return names[kind];
}

}  // namespace

// The transport of one rank: every call goes through the world's rendezvous.
class LoopbackWorld::RankTransport : public Transport {
 public:
  RankTransport(LoopbackWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_.world_size_; }

  std::unique_ptr<Pending> all_to_all(const Buffer& send, const std::vector<int64_t>& send_counts, const Buffer& recv,
                                      const std::vector<int64_t>& recv_counts, const std::string& what) override;
  std::unique_ptr<Pending> broadcast_buffer(const Buffer& buffer, int root, const std::string& what) override;
  std::vector<int64_t> all_reduce(const std::vector<int64_t>& local, ReduceOp op, const std::string& what) override {
    std::unique_lock<std::mutex> lock(world_.mutex_);
    int64_t seq = 0;
    Slot& slot = world_.arrive(rank_, Kind::kAllReduce, what, lock, &seq);
    slot.values[static_cast<size_t>(rank_)] = local;
    slot.op = op;
    if (++slot.arrived == world_.world_size_) world_.complete(slot);
    world_.await(rank_, seq, what, lock);
    std::vector<int64_t> out = world_.slots_.at(seq)->reduced;
    depart(seq);
    return out;
  }
  // Called with the lock held, after this rank's part of slot `seq` is over.
  void depart(int64_t seq) {
    auto it = world_.slots_.find(seq);
    if (it != world_.slots_.end() && ++it->second->departed == world_.world_size_) world_.slots_.erase(it);
  }

 private:
  friend class AsyncPending;
  LoopbackWorld& world_;
  int rank_;
};

// An all_to_all or broadcast_buffer in flight: wait() blocks until every rank has brought
// its buffers and the last one has copied. Left without wait() (an error unwinding), it
// fails the world so that nothing later copies from buffers this rank has freed.
class LoopbackWorld::AsyncPending : public Pending {
 public:
  AsyncPending(RankTransport& transport, int64_t seq, std::string what)
      : transport_(transport), seq_(seq), what_(std::move(what)) {}
  ~AsyncPending() override {
    if (waited_) return;
    LoopbackWorld& world = transport_.world_;
    std::lock_guard<std::mutex> lock(world.mutex_);
    auto it = world.slots_.find(seq_);
    if (it != world.slots_.end() && !it->second->done)
      world.fail_locked("rank " + std::to_string(transport_.rank_) + " left all_to_all '" + what_ +
                        "' before it completed");
    transport_.depart(seq_);
  }
  void wait() override {
    LoopbackWorld& world = transport_.world_;
    std::unique_lock<std::mutex> lock(world.mutex_);
    waited_ = true;
    world.await(transport_.rank_, seq_, what_, lock, world.options_.move_when_waited);
    transport_.depart(seq_);
  }
  bool ready() override {
    if (waited_) return true;
    LoopbackWorld& world = transport_.world_;
    std::lock_guard<std::mutex> lock(world.mutex_);
    auto it = world.slots_.find(seq_);
    return !world.failure_.empty() || (it != world.slots_.end() && it->second->done);
  }

 private:
  RankTransport& transport_;
  int64_t seq_;
  std::string what_;
  bool waited_ = false;
};

std::unique_ptr<Pending> LoopbackWorld::RankTransport::all_to_all(const Buffer& send,
                                                                  const std::vector<int64_t>& send_counts,
                                                                  const Buffer& recv,
                                                                  const std::vector<int64_t>& recv_counts,
                                                                  const std::string& what) {
  std::unique_lock<std::mutex> lock(world_.mutex_);
  int64_t seq = 0;
  Slot& slot = world_.arrive(rank_, Kind::kAllToAll, what, lock, &seq);
  const size_t r = static_cast<size_t>(rank_);
  slot.send[r] = send;
  slot.recv[r] = recv;
  slot.send_counts[r] = send_counts;
  slot.recv_counts[r] = recv_counts;
  if (++slot.arrived == world_.world_size_ && !world_.options_.move_when_waited) world_.complete(slot);
  return std::make_unique<AsyncPending>(*this, seq, what);
}

std::unique_ptr<Pending> LoopbackWorld::RankTransport::broadcast_buffer(const Buffer& buffer, int root,
                                                                        const std::string& what) {
  std::unique_lock<std::mutex> lock(world_.mutex_);
  int64_t seq = 0;
  Slot& slot = world_.arrive(rank_, Kind::kBroadcastBuffer, what, lock, &seq);
  slot.recv[static_cast<size_t>(rank_)] = buffer;
  if (rank_ == slot.first_rank) slot.root = root;
  else if (slot.root != root) {
    world_.fail_locked("'" + what + "': rank " + std::to_string(rank_) + " broadcasts from rank " +
                       std::to_string(root) + ", rank " + std::to_string(slot.first_rank) + " from rank " +
                       std::to_string(slot.root));
    DMUON_FAIL("loopback rank ", rank_, ": '", what, "' failed: ", world_.failure_);
  }
  if (++slot.arrived == world_.world_size_ && !world_.options_.move_when_waited) world_.complete(slot);
  return std::make_unique<AsyncPending>(*this, seq, what);
}

LoopbackWorld::LoopbackWorld(int world_size, LoopbackOptions options)
    : world_size_(world_size), options_(std::move(options)) {
  DMUON_CHECK(world_size_ >= 1, "LoopbackWorld: world size must be >= 1, got ", world_size_);
  if (!options_.copy) options_.copy = [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
  for (int r = 0; r < world_size_; ++r) transports_.push_back(std::make_unique<RankTransport>(*this, r));
  next_seq_.assign(static_cast<size_t>(world_size_), 0);
  finished_.assign(static_cast<size_t>(world_size_), false);
}

LoopbackWorld::~LoopbackWorld() = default;

Transport& LoopbackWorld::transport(int rank) {
  DMUON_CHECK(rank >= 0 && rank < world_size_, "LoopbackWorld: rank ", rank, " outside a world of ", world_size_);
  return *transports_[static_cast<size_t>(rank)];
}

int64_t LoopbackWorld::num_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_completed_;
}

LoopbackWorld::Slot& LoopbackWorld::arrive(int rank, Kind kind, const std::string& what,
                                           std::unique_lock<std::mutex>&, int64_t* seq) {
  if (!failure_.empty())
    DMUON_FAIL("loopback rank ", rank, ": ", kind_name(static_cast<int>(kind)), " '", what, "' failed: ", failure_);
  *seq = next_seq_[static_cast<size_t>(rank)]++;
  std::unique_ptr<Slot>& slot = slots_[*seq];
  if (!slot) {
    slot = std::make_unique<Slot>(world_size_);
    slot->kind = kind;
    slot->what = what;
    slot->first_rank = rank;
  } else if (slot->kind != kind || slot->what != what) {
    std::ostringstream why;
    why << "rank " << rank << " called " << kind_name(static_cast<int>(kind)) << " '" << what << "' as collective #"
        << *seq << ", where rank " << slot->first_rank << " called " << kind_name(static_cast<int>(slot->kind))
        << " '" << slot->what << "'";
    fail_locked(why.str());
    DMUON_FAIL("loopback rank ", rank, ": ", why.str());
  }
  return *slot;
}

void LoopbackWorld::await(int rank, int64_t seq, const std::string& what, std::unique_lock<std::mutex>& lock,
                          bool move) {
  // A rank that finished before reaching this collective will never arrive.
  auto deserted = [&]() -> int {
    for (int r = 0; r < world_size_; ++r)
      if (finished_[static_cast<size_t>(r)] && next_seq_[static_cast<size_t>(r)] <= seq) return r;
    return -1;
  };
  auto arrived = [&] {
    auto it = slots_.find(seq);
    return it != slots_.end() && it->second->arrived == world_size_;
  };
  changed_.wait(lock, [&] {
    auto it = slots_.find(seq);
    return (it != slots_.end() && it->second->done) || (move && arrived()) || !failure_.empty() || deserted() >= 0;
  });
  auto it = slots_.find(seq);
  if (it != slots_.end() && it->second->done) return;
  if (move && arrived() && failure_.empty()) {
    complete(*it->second);
    return;
  }
  if (failure_.empty()) {
    const int gone = deserted();
    fail_locked("rank " + std::to_string(gone) + " finished without calling collective #" + std::to_string(seq) +
                " ('" + what + "')");
  }
  DMUON_FAIL("loopback rank ", rank, ": '", what, "' failed: ", failure_);
}

void LoopbackWorld::complete(Slot& slot) {
  const size_t world = static_cast<size_t>(world_size_);
  auto fail = [&](const std::string& why) {
    fail_locked("'" + slot.what + "': " + why);
    DMUON_FAIL("loopback: '", slot.what, "': ", why);
  };
  if (slot.kind == Kind::kAllToAll) {
    for (size_t r = 0; r < world; ++r) {
      if (slot.send_counts[r].size() != world || slot.recv_counts[r].size() != world)
        fail("rank " + std::to_string(r) + " passed split sizes for a world of " +
             std::to_string(slot.send_counts[r].size()) + "/" + std::to_string(slot.recv_counts[r].size()));
      if (slot.send[r].dtype != slot.send[0].dtype || slot.recv[r].dtype != slot.send[0].dtype)
        fail("rank " + std::to_string(r) + " passed buffers of another element type");
      int64_t sent = 0, received = 0;
      for (size_t d = 0; d < world; ++d) sent += slot.send_counts[r][d], received += slot.recv_counts[r][d];
      if (sent > slot.send[r].numel || received > slot.recv[r].numel)
        fail("rank " + std::to_string(r) + " splits " + std::to_string(sent) + "/" + std::to_string(received) +
             " elements over buffers of " + std::to_string(slot.send[r].numel) + "/" +
             std::to_string(slot.recv[r].numel));
    }
    for (size_t s = 0; s < world; ++s)
      for (size_t d = 0; d < world; ++d)
        if (slot.send_counts[s][d] != slot.recv_counts[d][s])
          fail("rank " + std::to_string(s) + " sends " + std::to_string(slot.send_counts[s][d]) + " elements to rank " +
               std::to_string(d) + ", which expects " + std::to_string(slot.recv_counts[d][s]));
    if (options_.before_copy) options_.before_copy();
    const int64_t elem = dtype_size(slot.send[0].dtype);
    for (size_t d = 0; d < world; ++d) {
      int64_t recv_at = 0;
      for (size_t s = 0; s < world; ++s) {
        int64_t send_at = 0;
        for (size_t k = 0; k < d; ++k) send_at += slot.send_counts[s][k];
        const int64_t count = slot.send_counts[s][d];
        if (count > 0)
          options_.copy(static_cast<char*>(slot.recv[d].data) + recv_at * elem,
                        static_cast<const char*>(slot.send[s].data) + send_at * elem, static_cast<size_t>(count * elem));
        recv_at += slot.recv_counts[d][s];
      }
    }
  } else if (slot.kind == Kind::kBroadcastBuffer) {
    if (slot.root < 0 || static_cast<size_t>(slot.root) >= world) fail("root " + std::to_string(slot.root) + " outside the world");
    const Buffer& from = slot.recv[static_cast<size_t>(slot.root)];
    for (size_t r = 0; r < world; ++r)
      if (slot.recv[r].dtype != from.dtype || slot.recv[r].numel != from.numel)
        fail("rank " + std::to_string(r) + " passed " + std::to_string(slot.recv[r].numel) + " elements of " +
             dtype_name(slot.recv[r].dtype) + ", the root " + std::to_string(from.numel) + " of " +
             dtype_name(from.dtype));
    if (options_.before_copy) options_.before_copy();
    for (size_t r = 0; r < world; ++r)
      if (static_cast<int>(r) != slot.root && from.numel > 0)
        options_.copy(slot.recv[r].data, from.data, static_cast<size_t>(from.bytes()));
  } else if (slot.kind == Kind::kAllReduce) {
    slot.reduced = slot.values[0];
    for (size_t r = 1; r < world; ++r) {
      if (slot.values[r].size() != slot.reduced.size())
        fail("rank " + std::to_string(r) + " reduces " + std::to_string(slot.values[r].size()) +
             " values, rank 0 " + std::to_string(slot.reduced.size()));
      for (size_t i = 0; i < slot.reduced.size(); ++i)
        slot.reduced[i] = slot.op == ReduceOp::kSum ? slot.reduced[i] + slot.values[r][i]
                                                    : std::max(slot.reduced[i], slot.values[r][i]);
    }
  }
  slot.done = true;
  ++num_completed_;
  changed_.notify_all();
}

void LoopbackWorld::fail_locked(const std::string& why) {
  if (failure_.empty()) failure_ = why;
  changed_.notify_all();
}

void LoopbackWorld::abort(int rank, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_locked("rank " + std::to_string(rank) + " failed: " + why);
}

void LoopbackWorld::finish(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_[static_cast<size_t>(rank)] = true;
  changed_.notify_all();
}

std::vector<std::string> LoopbackWorld::run(const std::function<void(int rank)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_.assign(static_cast<size_t>(world_size_), false);
  }
  std::vector<std::string> errors(static_cast<size_t>(world_size_));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size_; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& error) {
        errors[static_cast<size_t>(r)] = error.what();
        abort(r, error.what());
      } catch (...) {
        errors[static_cast<size_t>(r)] = "unknown exception";
        abort(r, "unknown exception");
      }
      finish(r);
    });
  }
  for (std::thread& t : threads) t.join();
  // NOTE: a failure no rank raised (a collective left in flight, unwaited, by a rank that
  // went on): every rank reports it.
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty() && std::all_of(errors.begin(), errors.end(), [](const std::string& e) { return e.empty(); }))
    for (std::string& e : errors) e = "loopback: " + failure_;
  return errors;
}

// ---------------------------------------------------------------- NoDataTransport
namespace {

class DonePending : public Pending {
 public:
  void wait() override {}
  bool ready() override { return true; }
};

}  // namespace

NoDataTransport::NoDataTransport(int rank, int world_size) : rank_(rank), world_size_(world_size) {
  DMUON_CHECK(world_size_ >= 1 && rank_ >= 0 && rank_ < world_size_, "NoDataTransport: rank ", rank_,
              " outside a world of ", world_size_);
}

std::unique_ptr<Pending> NoDataTransport::all_to_all(const Buffer& send, const std::vector<int64_t>& send_counts,
                                                     const Buffer& recv, const std::vector<int64_t>& recv_counts,
                                                     const std::string& what) {
  DMUON_CHECK(send_counts.size() == static_cast<size_t>(world_size_) &&
                  recv_counts.size() == static_cast<size_t>(world_size_),
              what, ": split sizes for a world of ", send_counts.size(), "/", recv_counts.size(), ", expected ",
              world_size_);
  int64_t sent = 0, received = 0;
  for (int r = 0; r < world_size_; ++r) sent += send_counts[static_cast<size_t>(r)], received += recv_counts[static_cast<size_t>(r)];
  DMUON_CHECK(sent <= send.numel && received <= recv.numel, what, ": splits of ", sent, "/", received,
              " elements over buffers of ", send.numel, "/", recv.numel);
  return std::make_unique<DonePending>();
}

std::vector<int64_t> NoDataTransport::all_reduce(const std::vector<int64_t>& local, ReduceOp op, const std::string&) {
  std::vector<int64_t> out = local;
  if (op == ReduceOp::kSum)
    for (int64_t& v : out) v *= world_size_;
  return out;
}

std::unique_ptr<Pending> NoDataTransport::broadcast_buffer(const Buffer&, int root, const std::string& what) {
  DMUON_CHECK(root >= 0 && root < world_size_, what, ": root ", root, " outside a world of ", world_size_);
  return std::make_unique<DonePending>();
}

}  // namespace dmuon::testing
