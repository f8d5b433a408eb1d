// dmuon/torch/engine/c10d_transport.cpp — the engine's collectives through c10d.
#include "engine/c10d_transport.h"

#include <ATen/ATen.h>

#include <numeric>

#include "all_to_all.h"
#include "common/check.h"
#include "step_tensors.h"
#include "world_detect.h"

namespace dmuon::torch_adapter {
namespace {

// A collective of a group whose work already completed (or that had nothing to do).
class Done : public step::Pending {
 public:
  void wait() override {}
  bool ready() override { return true; }
};

// A collective in flight (all_to_all, broadcast_buffer): its Work, whose tensors view the
// caller's buffers.
class InFlight : public step::Pending {
 public:
  InFlight(const C10dTransport& transport, c10::intrusive_ptr<c10d::Work> work, std::string what)
      : transport_(transport), work_(std::move(work)), what_(std::move(what)) {}
  // NOTE: on CUDA, wait() is a stream's wait for the collective's: never a host wait.
  bool ready() override {
    if (!work_ || transport_.on_cuda()) return true;
    try {
      return work_->isCompleted();
    } catch (const std::exception&) {
      return true;  // NOTE: wait() throws its error, naming the collective
    }
  }
  void wait() override {
    if (!work_) return;
    try {
      // NOTE: on NCCL, Work::wait() makes the current stream (the ops', during a step)
      // wait for the collective's stream; the host does not block.
      work_->wait();
    } catch (const std::exception& error) {
      work_.reset();
      DMUON_FAIL("dmuon: ", what_, " failed on rank ", transport_.rank(), " of ", transport_.world_size(), ": ",
                 error.what());
    }
    work_.reset();
  }

 private:
  const C10dTransport& transport_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
};

int64_t total(const std::vector<int64_t>& counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> group, step::Device device)
    : group_(std::move(group)), device_(device) {
  if (group_ && group_->getSize() == 1) group_.reset();
  model_ = detect_world_model(group_, device_.kind == step::DeviceKind::kCuda ? "cuda" : "cpu");
}

c10::intrusive_ptr<c10d::Work> C10dTransport::issue(const std::function<c10::intrusive_ptr<c10d::Work>()>& collective,
                                                    const std::string& what) const {
  try {
    return collective();
  } catch (const std::exception& error) {
    DMUON_FAIL("dmuon: ", what, " failed on rank ", rank(), " of ", world_size(), ": ", error.what());
  }
}

void C10dTransport::run(const std::function<c10::intrusive_ptr<c10d::Work>()>& collective,
                        const std::string& what) const {
  InFlight(*this, issue(collective, what), what).wait();
}

std::unique_ptr<step::Pending> C10dTransport::all_to_all(const step::Buffer& send,
                                                         const std::vector<int64_t>& send_counts,
                                                         const step::Buffer& recv,
                                                         const std::vector<int64_t>& recv_counts,
                                                         const std::string& what) {
  const size_t world = static_cast<size_t>(world_size());
  DMUON_CHECK(send_counts.size() == world && recv_counts.size() == world, "dmuon: ", what, " on rank ", rank(),
              ": ", send_counts.size(), " send and ", recv_counts.size(), " receive counts for a world of ", world);
  DMUON_CHECK(total(send_counts) <= send.numel && total(recv_counts) <= recv.numel, "dmuon: ", what, " on rank ",
              rank(), ": counts of ", total(send_counts), " and ", total(recv_counts),
              " elements exceed the buffers of ", send.numel, " and ", recv.numel);
  DMUON_CHECK(send.dtype == recv.dtype, "dmuon: ", what, " on rank ", rank(), ": send buffer of ",
              step::dtype_name(send.dtype), ", receive buffer of ", step::dtype_name(recv.dtype));
  if (!model_.communicates() || !model_.moves_data()) return std::make_unique<Done>();
  at::Tensor input = tensor_view(send.slice(0, total(send_counts), what.c_str()));
  at::Tensor output = tensor_view(recv.slice(0, total(recv_counts), what.c_str()));
  std::vector<int64_t> input_splits = send_counts, output_splits = recv_counts;
  return std::make_unique<InFlight>(
      *this, issue([&] { return all_to_all_single(*group_, output, input, output_splits, input_splits); }, what), what);
}

std::unique_ptr<step::Pending> C10dTransport::broadcast_buffer(const step::Buffer& buffer, int root,
                                                               const std::string& what) {
  DMUON_CHECK(root >= 0 && root < world_size(), "dmuon: ", what, " on rank ", rank(), ": root ", root,
              " outside a world of ", world_size());
  if (!model_.communicates() || !model_.moves_data()) return std::make_unique<Done>();
  std::vector<at::Tensor> tensors{tensor_view(buffer)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return std::make_unique<InFlight>(*this, issue([&] { return group_->broadcast(tensors, opts); }, what), what);
}

std::vector<int64_t> C10dTransport::all_reduce(const std::vector<int64_t>& local, step::ReduceOp op,
                                               const std::string& what) {
  if (local.empty() || !model_.communicates()) return local;
  const layout::FlagOp flag_op = op == step::ReduceOp::kSum ? layout::FlagOp::kSum : layout::FlagOp::kMax;
  if (!model_.moves_data()) return model_.modelled_agreement(local, flag_op);
  c10d::AllreduceOptions opts;
  opts.reduceOp = op == step::ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  std::vector<at::Tensor> tensors{
      at::tensor(local, at::TensorOptions().dtype(at::kLong)).to(torch_device(device_))};
  run([&] { return group_->allreduce(tensors, opts); }, what);
  const at::Tensor host = tensors[0].to(at::kCPU).contiguous();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

}  // namespace dmuon::torch_adapter
