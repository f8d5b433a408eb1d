// dmuon/torch/engine/c10d_transport.h — step::Transport over a c10d process group (the
// torch adapter's transport for the step engine and the ownership runtime).
//
//   all_to_all   c10d's all_to_all over flat tensors that view the engine's Buffers (uneven
//                counts); on a CUDA group it is enqueued after the work on torch's current
//                stream (the caller runs the step with the ops' stream current), and
//                Pending::wait() makes that stream wait for it (no host sync)
//   broadcast_buffer  a buffer from a root, enqueued like all_to_all
//   all_reduce   small int64 host vectors (through a device tensor on a NCCL group)
// Pending::ready() is isCompleted() on the CPU, always true on CUDA (wait() is a stream's).
// Over torch's fake backend (csrc/torch/world_detect.h) nothing moves: moves_data() is
// false, all_to_all completes at once, all_reduce returns the model "every rank holds
// these values" (layout::WorldModel::modelled_agreement).
// Every failure throws dmuon::Error naming the collective (`what`) and the rank.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layout/world_model.h"
#include "step/transport.h"

namespace dmuon::torch_adapter {

class C10dTransport : public step::Transport {
 public:
  /// `group` null or of size 1: one rank (collectives return their input). `device`: where
  /// the reductions' and broadcasts' tensors live (a CUDA device on a NCCL group).
  /// The transport (single, real, fake) is detected here, once.
  C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> group, step::Device device);

  int rank() const override { return model_.rank(); }
  int world_size() const override { return model_.world_size(); }
  bool moves_data() const override { return model_.moves_data(); }
  /// How dmuon treats the group (single, real, fake).
  const layout::WorldModel& world_model() const { return model_; }

  std::unique_ptr<step::Pending> all_to_all(const step::Buffer& send, const std::vector<int64_t>& send_counts,
                                            const step::Buffer& recv, const std::vector<int64_t>& recv_counts,
                                            const std::string& what) override;
  std::unique_ptr<step::Pending> broadcast_buffer(const step::Buffer& buffer, int root,
                                                 const std::string& what) override;
  std::vector<int64_t> all_reduce(const std::vector<int64_t>& local, step::ReduceOp op,
                                  const std::string& what) override;
  /// Whether its collectives are a CUDA device's (their waits are streams').
  bool on_cuda() const { return device_.kind == step::DeviceKind::kCuda; }

 private:
  // Issues a collective (run: and waits for it; CUDA: the current stream waits); throws
  // naming `what` and the rank when either fails.
  c10::intrusive_ptr<c10d::Work> issue(const std::function<c10::intrusive_ptr<c10d::Work>()>& collective,
                                       const std::string& what) const;
  void run(const std::function<c10::intrusive_ptr<c10d::Work>()>& collective, const std::string& what) const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  step::Device device_;
  layout::WorldModel model_;
};

}  // namespace dmuon::torch_adapter
