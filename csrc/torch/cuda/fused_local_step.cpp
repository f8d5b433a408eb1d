// dmuon/torch/cuda/fused_local_step.cpp — batches of whole matrices through the fused kernels.
#include "fused_local_step.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "common/check.h"
#include "common/env.h"
#include "cuda_orthogonalize.h"
#include "ns/cuda/cuda_backend.h"
#include "ns/cuda/cuda_check.h"

namespace dmuon::torch_adapter {
namespace {

// NOTE: Gram NS iterates in fp16, standard NS in bf16 (DESIGN.md §3), as orthogonalize()'s "auto".
at::ScalarType iterate_dtype(ns::Algorithm algorithm) {
  return algorithm == ns::Algorithm::kGram ? at::kHalf : at::kBFloat16;
}

ns::cuda::MomentumRule rule_of(const MuonGroupOptions& options) { return {options.momentum, options.nesterov}; }

// dmuon's own stream `index` (≥ 1) of a device, made once and kept.
// NOTE: not the pool's (getStreamFromPool hands its streams out in turn, and to others):
// the graph cache is keyed by stream, so a batch must find the same stream every step.
c10::cuda::CUDAStream own_stream(c10::DeviceIndex device, int index) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t& s = streams[{static_cast<int>(device), index}];
  if (s == nullptr) {
    const c10::cuda::CUDAGuard guard(device);
    DMUON_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  return c10::cuda::getStreamFromExternal(s, device);
}

// Makes `main` wait for the other streams' work when it goes out of scope.
// NOTE: it also runs while an error unwinds (buffers freed then must not be in use on the
// other streams), so it never throws: where an event fails it waits on the host instead.
struct JoinStreams {
  c10::cuda::CUDAStream main;
  std::vector<c10::cuda::CUDAStream> others;
  ~JoinStreams() {
    for (const c10::cuda::CUDAStream& s : others) {
      cudaEvent_t done = nullptr;
      const bool joined = cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess &&
                          cudaEventRecord(done, s.stream()) == cudaSuccess &&
                          cudaStreamWaitEvent(main.stream(), done, 0) == cudaSuccess;
      if (done != nullptr) cudaEventDestroy(done);
      if (!joined) {
        cudaGetLastError();
        cudaStreamSynchronize(s.stream());
      }
    }
  }
};

}  // namespace

namespace {
optim::FusedTensor traits_of(const at::Tensor& t) {
  optim::FusedTensor out;
  out.defined = t.defined();
  if (!out.defined) return out;
  out.cuda = t.is_cuda();
  out.float32 = t.scalar_type() == at::kFloat;
  out.contiguous = t.is_contiguous();
  out.device = out.cuda ? t.get_device() : -1;
  out.sizes = t.sizes().vec();
  return out;
}
}  // namespace

bool fused_local_step_usable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum,
                             const MuonGroupOptions& options, bool enabled) {
  // NOTE: the kernel's usability is asked only where the rest allows the fused path.
  if (!optim::fused_path_takes(traits_of(param), traits_of(grad), traits_of(momentum), enabled, true)) return false;
  return cuda_sym_kernel_usable(param, iterate_dtype(options.schedule.algorithm));
}

int64_t fused_batch_capacity(int64_t rows, int64_t cols, const ns::Schedule& schedule, int64_t limit_bytes) {
  DMUON_CHECK(limit_bytes >= 1, "fused_batch_capacity: the workspace bound must be at least 1 byte, got ", limit_bytes);
  const size_t one = ns::cuda::workspace_bytes(schedule.algorithm, 1, rows, cols);
  const size_t per_matrix = ns::cuda::workspace_bytes(schedule.algorithm, 2, rows, cols) - one;
  const size_t limit = static_cast<size_t>(limit_bytes);
  if (one >= limit) return 1;
  return 1 + static_cast<int64_t>((limit - one) / std::max<size_t>(per_matrix, 1));
}

bool FusedBatch::same_tensors(const FusedBatch& other) const {
  if (group != other.group || rows != other.rows || cols != other.cols || members != other.members ||
      matrices.size() != other.matrices.size())
    return false;
  for (size_t k = 0; k < matrices.size(); ++k)
    if (matrices[k].param != other.matrices[k].param || matrices[k].grad != other.matrices[k].grad ||
        matrices[k].momentum != other.matrices[k].momentum)
      return false;
  return true;
}

FusedBatch make_fused_batch(int64_t group, int64_t rows, int64_t cols, std::vector<int> members,
                            at::TensorList params, const std::vector<at::Tensor>& grads,
                            const std::vector<at::Tensor>& momenta) {
  FusedBatch batch;
  batch.group = group, batch.rows = rows, batch.cols = cols;
  batch.members = std::move(members);
  const int64_t matrix_numel = rows * cols;
  for (size_t m = 0; m < batch.members.size(); ++m) {
    const int idx = batch.members[m];
    const at::Tensor& p = params[static_cast<size_t>(idx)];
    DMUON_CHECK(p.numel() % matrix_numel == 0, "fused batch: parameter ", idx, " of shape ", p.sizes(),
                " is not whole ", rows, "x", cols, " matrices");
    const at::Tensor& buffer = momenta[static_cast<size_t>(idx)];
    for (int64_t k = 0; k < p.numel() / matrix_numel; ++k) {
      batch.matrices.push_back({p.data_ptr<float>() + k * matrix_numel,
                                grads[static_cast<size_t>(idx)].data_ptr<float>() + k * matrix_numel,
                                buffer.defined() ? buffer.data_ptr<float>() + k * matrix_numel : nullptr});
      batch.matrix_member.push_back(static_cast<int>(m));
    }
  }
  return batch;
}

at::Tensor fused_check(const FusedBatch& batch, const MuonGroupOptions& options, const at::Tensor& like,
                       const at::Tensor& flags) {
  c10::cuda::CUDAGuard guard(like.device());
  const int64_t count = static_cast<int64_t>(batch.matrices.size());
  DMUON_CHECK(!flags.defined() || (flags.is_cuda() && flags.scalar_type() == at::kInt && flags.numel() == 2 * count),
              "fused_check: flags must be int32 CUDA [", count, ", 2]");
  at::Tensor partials = at::empty({ns::cuda::num_partials(count, batch.rows, batch.cols)}, like.options());
  ns::cuda::check_partials(batch.matrices.data(), count, batch.rows, batch.cols, rule_of(options),
                           partials.data_ptr<float>(), flags.defined() ? flags.data_ptr<int>() : nullptr,
                           at::cuda::getCurrentCUDAStream());
  return partials;
}

void fused_update(const FusedBatch& batch, const MuonGroupOptions& options, const ns::Schedule& schedule,
                  const at::Tensor& partials, const at::Tensor& like, const at::Tensor& flag,
                  const std::function<void(const char* phase)>& phase_done, bool graphs, const at::Tensor& gate) {
  DMUON_CHECK(flag.is_cuda() && flag.scalar_type() == at::kInt && flag.numel() == 1,
              "fused_update: flag must be one int32 CUDA element");
  DMUON_CHECK(!gate.defined() || (gate.is_cuda() && gate.scalar_type() == at::kInt && gate.numel() == 1 &&
                                  gate.device() == like.device()),
              "fused_update: gate must be one int32 element on the batch's device");
  const int* skip = gate.defined() ? gate.data_ptr<int>() : nullptr;
  for (const auto& m : batch.matrices)
    DMUON_CHECK(m.momentum != nullptr, "fused_update: a momentum buffer of parameter ",
                batch.members[static_cast<size_t>(batch.matrix_member[&m - batch.matrices.data()])],
                " is missing");
  c10::cuda::CUDAGuard guard(like.device());
  auto done = [&](const char* phase) {
    if (phase_done) phase_done(phase);
  };
  const int64_t count = static_cast<int64_t>(batch.matrices.size()), rows = batch.rows, cols = batch.cols;
  at::Tensor scales = at::empty({count}, like.options());
  ns::cuda::partials_to_scales(partials.data_ptr<float>(), count, rows, cols, schedule.eps, scales.data_ptr<float>(),
                               at::cuda::getCurrentCUDAStream());

  // Pass 2 inside the backend's run, then pass 3 on its result.
  // NOTE: the backend may prepare the iterate more than once (the autotuner's first run of
  // a problem): only the first preparation updates the momentum, later ones read it.
  const at::ScalarType dtype = iterate_dtype(schedule.algorithm);
  const ns::cuda::DType half = dtype == at::kHalf ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
  const bool use_kernel = cuda_sym_kernel_usable(like, dtype);
  const ns::cuda::MomentumRule rule = rule_of(options);
  const float* scale_ptr = scales.data_ptr<float>();
  const double update_scale = batch.transposed ? options.update_scale(cols, rows) : options.update_scale(rows, cols);
  const double decay = options.decay();
  int* flag_ptr = flag.data_ptr<int>();
  bool momentum_updated = false, ns_reported = false;
  orthogonalize_cuda_prepared(
      count, rows, cols, schedule, dtype, use_kernel, like,
      [&](void* x, int64_t ld, cudaStream_t s) {
        ns::cuda::normalized_update(half, batch.matrices.data(), count, rows, cols, rule, !momentum_updated,
                                    scale_ptr, x, ld, s, skip);
        momentum_updated = true;
      },
      [&](const void* result, int64_t ld, cudaStream_t s) {
        done("ns");
        ns_reported = true;
        ns::cuda::apply_result(half, result, ld, batch.matrices.data(), count, rows, cols, update_scale, decay,
                               flag_ptr, s, skip);
      },
      graphs);
  DMUON_CHECK(momentum_updated, "internal: the fused batch's iterate was never prepared");
  if (!ns_reported) done("ns");
  done("apply");
}

// ---------------------------------------------------------------- streams of the gated step
int fused_stream_count(int64_t requested) {
  return optim::gated_stream_count(requested, requested != 0 ? 0 : env::kFusedStreams.get());
}

std::vector<int> fused_batch_streams(const std::vector<FusedBatch>& batches, const std::vector<optim::GatedBatch>& warm,
                                     const std::vector<ns::Schedule>& schedules, int num_streams) {
  std::vector<optim::GatedBatch> problems;
  for (const FusedBatch& batch : batches) problems.push_back(batch.problem());
  return optim::gated_batch_streams(problems, warm, schedules, num_streams);
}

int run_on_streams(const std::vector<int>& stream_of, const at::Device& device,
                   const std::function<void(size_t)>& run) {
  DMUON_CHECK(device.is_cuda(), "run_on_streams: expected a CUDA device, got ", device);
  const int num_streams = stream_of.empty() ? 1 : 1 + *std::max_element(stream_of.begin(), stream_of.end());
  const c10::cuda::CUDAGuard guard(device);
  JoinStreams join{c10::cuda::getCurrentCUDAStream(device.index()), {}};
  std::vector<c10::cuda::CUDAStream> streams{join.main};
  if (num_streams > 1) {
    at::cuda::CUDAEvent forked;
    forked.record(join.main);
    for (int i = 1; i < num_streams; ++i) {
      streams.push_back(own_stream(device.index(), i));
      forked.block(streams.back());
      join.others.push_back(streams.back());
    }
  }
  for (size_t k = 0; k < stream_of.size(); ++k) {
    DMUON_CHECK(stream_of[k] >= 0, "run_on_streams: stream ", stream_of[k], " of batch ", k, " is negative");
    const c10::cuda::CUDAStreamGuard on(streams[static_cast<size_t>(stream_of[k])]);
    run(k);
  }
  return num_streams;
}

}  // namespace dmuon::torch_adapter
