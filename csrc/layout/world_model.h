// dmuon/layout/world_model.h — what the other ranks of a step's process group are to this
// process, decided once when a runtime is made.
//
// Three transports:
//   single  one process: nothing is exchanged or agreed;
//   real    a group whose collectives move data (NCCL, Gloo): today's behaviour;
//   fake    torch's fake c10d backend: this process plays rank r of a world of D ranks,
//           collectives complete at once and move nothing. The other ranks exist only in
//           the model "every rank behaves like this one": every rank holds the same
//           parameters and options and decides the same plan (so decisions are computed
//           locally, never broadcast), a sum over ranks of a per-rank flag is local × D, a
//           max is local, and the engine fills a received buffer with what the model says
//           arrived (step/engine.cpp), so that the rank's own work runs on defined data and
//           takes its real time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dmuon::layout {

enum class Transport { kSingle, kReal, kFake };

/// "single" | "real" | "fake".
const char* transport_name(Transport transport);

/// Element-wise reductions of per-rank flags.
enum class FlagOp { kSum, kMax };

/// The relation of this process to its group's ranks; immutable once made.
class WorldModel {
 public:
  WorldModel() = default;
  /// Throws dmuon::Error naming rank and world_size when they do not describe a rank of
  /// the world (world_size ≥ 1, 0 ≤ rank < world_size; single: world_size 1).
  WorldModel(Transport transport, int rank, int world_size);

  Transport transport() const { return transport_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  /// Whether the step issues collectives at all (more than one rank, real or fake).
  bool communicates() const { return transport_ != Transport::kSingle && world_size_ > 1; }
  /// Whether collectives move data (a broadcast arrives, an all_reduce reduces).
  bool moves_data() const { return transport_ == Transport::kReal && world_size_ > 1; }

  /// The agreement of per-rank flags under the model: the element-wise reduction over
  /// world_size() ranks that each hold `local` (sum: local × D; max: local). Only for a
  /// transport that does not move data (fake, or one rank); throws otherwise.
  std::vector<int64_t> modelled_agreement(const std::vector<int64_t>& local, FlagOp op) const;

  /// Throws dmuon::Error naming `what` when the transport is fake: for work whose results
  /// must arrive from other ranks (e.g. weights published by their owners).
  void require_data_movement(const std::string& what) const;

 private:
  Transport transport_ = Transport::kSingle;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace dmuon::layout
