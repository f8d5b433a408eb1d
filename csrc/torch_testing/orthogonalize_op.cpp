// dmuon/torch_testing/orthogonalize_op.cpp — torch.ops.dmuon_testing.orthogonalize: Newton–
// Schulz of a tensor of matrices on a chosen backend and iteration precision, for tests and
// benchmarks (the step runs NS through its own engine). Backends: the CPU core, ATen's
// batched products (engine/aten_ns.h) and, on CUDA, the step engine's ops (step/cuda).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/check.h"
#include "common/env.h"
#include "engine/aten_ns.h"
#include "engine/torch_ops.h"
#include "ns/cpu/cpu_backend.h"
#include "ns/schedule.h"
#include "step_tensors.h"
#include "torch_testing/op_errors.h"

#if defined(DMUON_WITH_CUDA) && defined(DMUON_WITH_STEP_CUDA)
#include "step/cuda/cuda_ops.h"
#define DMUON_HAS_CUDA_BACKEND 1
#endif

namespace dmuon::torch_adapter {
namespace {

#if defined(DMUON_HAS_CUDA_BACKEND)
using OpsKey = std::tuple<int, int64_t, bool>;  // device, stream id, symmetric kernel

std::mutex& ops_mutex() {
  static std::mutex mutex;
  return mutex;
}

// NOTE: kept for the process and never destroyed: their graph caches serve later calls,
// and their memory is the caching allocator's, which may be gone when statics die.
std::map<OpsKey, std::unique_ptr<step::DeviceOps>>& kept_ops() {
  static auto* ops = new std::map<OpsKey, std::unique_ptr<step::DeviceOps>>();
  return *ops;
}

// The step ops on the device's current stream: autotuned kernels, the graph cache and the
// symmetric kernel's self-check of step/cuda.
step::DeviceOps& step_ops(const at::Device& device, bool sym_kernel) {
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(device);
  std::lock_guard<std::mutex> lock(ops_mutex());
  std::unique_ptr<step::DeviceOps>& ops = kept_ops()[{device.index(), stream.id(), sym_kernel}];
  if (!ops) {
    TorchOpsOptions options;
    options.stream = stream;
    options.aten_float64 = false;
    options.sym_kernel = sym_kernel;
    ops = make_torch_ops({step::DeviceKind::kCuda, device.index()}, options);
  }
  return *ops;
}

// A [B, rows, cols] batch as an owner's pieces are: float32 rows in, the result's rows out.
at::Tensor orthogonalize_on(step::DeviceOps& ops, const at::Tensor& batch, const ns::Schedule& schedule, bool graphs) {
  const int64_t num = batch.size(0), rows = batch.size(1), cols = batch.size(2), numel = rows * cols;
  const at::Tensor input = batch.to(at::kFloat).contiguous();
  at::Tensor output = at::empty_like(input);
  const step::Buffer in = to_buffer(input, "orthogonalize's input"), out = to_buffer(output, "orthogonalize's output");
  std::vector<step::WirePiece> from, to;
  for (int64_t k = 0; k < num; ++k) {
    from.push_back({in.slice(k * numel, numel), k, 0, rows});
    to.push_back({out.slice(k * numel, numel), k, 0, rows});
  }
  const step::NsBatchDesc desc{rows, cols, num, step::DType::kFloat32, &schedule, graphs};
  // NOTE: on torch's default stream the ops run on a stream of their own (CudaOps makes one
  // for a null stream): joined both ways, or the caller's next kernel reads the output
  // before it is written (on an H100, 154 of 168 outputs read at once differed from the
  // same outputs read after a synchronize, NaN in most).
  const OpsStreamScope on_ops_stream(ops);
  ops.orthogonalize(
      desc, [&](const step::NsView& iterate, bool) { ops.iterate_from_pieces(from, desc, iterate, step::Buffer{}); },
      [&](const step::NsView& result) { ops.result_to_pieces(result, desc, to); });
  return output;
}

// [cached problems, captures, replays, bytes of kept workspaces] of the CUDA backend's
// graph caches, over every stream it ran on.
std::vector<int64_t> graph_stats_op(const at::Tensor&) {
  std::vector<int64_t> total(4, 0);
  std::lock_guard<std::mutex> lock(ops_mutex());
  for (const auto& [key, ops] : kept_ops()) {
    const std::vector<int64_t> stats = dynamic_cast<const step::CudaOps&>(*ops).graph_stats();
    for (size_t i = 0; i < total.size(); ++i) total[i] += stats[i];
  }
  return total;
}
#endif

// A validated schedule from the op's arguments (coefficients flattened as a,b,c,…).
ns::Schedule make_schedule(const std::string& algorithm, at::ArrayRef<double> coefficients,
                           at::IntArrayRef restart_after, double eps) {
  DMUON_CHECK(coefficients.size() % 3 == 0 && !coefficients.empty(),
              "ns_coefficients must hold 3 numbers (a, b, c) per step, got ", coefficients.size(),
              " numbers");
  ns::Schedule schedule;
  schedule.algorithm = ns::parse_algorithm(algorithm);
  for (size_t i = 0; i < coefficients.size(); i += 3)
    schedule.steps.push_back({coefficients[i], coefficients[i + 1], coefficients[i + 2]});
  for (int64_t r : restart_after) schedule.restart_after.push_back(static_cast<int>(r));
  schedule.eps = eps;
  schedule.validate();
  return schedule;
}

at::ScalarType parse_compute_dtype(const std::string& name, const at::Tensor& x,
                                   ns::Algorithm algorithm, bool use_core) {
  if (name == "auto") {
    if (x.scalar_type() == at::kDouble) return at::kDouble;
    if (use_core || !x.is_cuda()) return at::kFloat;
    return algorithm == ns::Algorithm::kGram ? at::kHalf : at::kBFloat16;
  }
  if (name == "float64") return at::kDouble;
  if (name == "float32") return at::kFloat;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  DMUON_FAIL("compute_dtype must be auto, float64, float32, float16 or bfloat16, got '", name, "'");
}

// Orthogonalize every matrix of x [..., m, n]; returns fp32 (fp64 for fp64 input) of x's
// shape. backend: "auto" | "core" (CPU core) | "aten" (batched ATen products) | "cuda" (the
// step's CUDA ops: sm_90a symmetric kernel where usable, else dense cuBLASLt products
// mirrored) | "cuda_dense" (the step's CUDA ops, always dense products mirrored);
// compute_dtype: "auto" | "float64" | "float32" | "float16" | "bfloat16". auto: CPU → core
// in fp32 (fp64 for fp64 input); CUDA → the CUDA ops in fp16 for Gram NS and bf16 for
// standard NS (DESIGN.md §3), other compute dtypes on ATen. The CUDA ops run on the current
// stream, their NS replayed as CUDA graphs where DMUON_CUDA_GRAPHS (default on) allows.
at::Tensor orthogonalize(const at::Tensor& x, const ns::Schedule& schedule, const std::string& backend,
                         const std::string& compute_dtype) {
  DMUON_CHECK(x.dim() >= 2, "orthogonalize: expected a tensor of matrices [..., m, n], got ",
              x.dim(), " dims");
  DMUON_CHECK(x.is_floating_point(), "orthogonalize: expected a floating tensor, got ",
              x.scalar_type());
  DMUON_CHECK(x.size(-1) >= 1 && x.size(-2) >= 1, "orthogonalize: empty matrices ", x.sizes());
  DMUON_CHECK(backend == "auto" || backend == "core" || backend == "aten" || backend == "cuda" ||
                  backend == "cuda_dense",
              "backend must be auto, core, aten, cuda or cuda_dense, got '", backend, "'");
  const bool use_core = backend == "core" || (backend == "auto" && x.device().is_cpu());
  DMUON_CHECK(!use_core || x.device().is_cpu(), "backend 'core' runs on CPU tensors only");
  const at::ScalarType dtype = parse_compute_dtype(compute_dtype, x, schedule.algorithm, use_core);
  const at::ScalarType out_dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;

  const int64_t rows = x.size(-2), cols = x.size(-1);
  at::Tensor batch = x.reshape({-1, rows, cols});
  if (batch.size(0) == 0) return at::empty(x.sizes(), x.options().dtype(out_dtype));

  // CUDA backend (the step's ops): "cuda" and "auto" → the sm_90a symmetric kernel where
  // usable (built, sm_90, self-check passed), else dense cuBLASLt products mirrored;
  // "cuda_dense" → always the latter. It iterates in the step's precision: Gram NS in
  // float16, standard NS in bfloat16 (other compute dtypes: the ATen path below).
  const bool half_dtype = dtype == at::kHalf || dtype == at::kBFloat16;
  const at::ScalarType step_half = schedule.algorithm == ns::Algorithm::kGram ? at::kHalf : at::kBFloat16;
  if (backend == "cuda" || backend == "cuda_dense") {
    DMUON_CHECK(x.is_cuda(), "backend '", backend, "' runs on CUDA tensors only");
    DMUON_CHECK(half_dtype, "backend '", backend, "' iterates in float16 or bfloat16, not ", dtype);
    DMUON_CHECK(dtype == step_half, "backend '", backend, "' iterates ", ns::algorithm_name(schedule.algorithm),
                " NS in ", step_half == at::kHalf ? "float16" : "bfloat16", " (the step's precision), not ",
                dtype == at::kHalf ? "float16" : "bfloat16", "; backend 'aten' takes either");
  }
#if defined(DMUON_HAS_CUDA_BACKEND)
  if (x.is_cuda() && dtype == step_half && backend != "aten")
    return orthogonalize_on(step_ops(x.device(), backend != "cuda_dense"), batch, schedule, env::kCudaGraphs.get())
        .to(out_dtype)
        .reshape(x.sizes());
#else
  DMUON_CHECK(backend != "cuda" && backend != "cuda_dense",
              "this build of dmuon has no CUDA backend (backend '", backend, "')");
#endif

  // CPU core: fp32 or fp64, in place on a private copy, parallel over the batch.
  if (use_core) {
    DMUON_CHECK(dtype == at::kFloat || dtype == at::kDouble,
                "the CPU core iterates in float32 or float64, not ", dtype);
    at::Tensor work = batch.to(dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
    auto parallel = [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
      at::parallel_for(0, n, 1, body);
    };
    if (dtype == at::kFloat)
      ns::orthogonalize_cpu<float>(schedule, work.data_ptr<float>(), work.size(0), rows, cols, parallel);
    else
      ns::orthogonalize_cpu<double>(schedule, work.data_ptr<double>(), work.size(0), rows, cols, parallel);
    return work.to(out_dtype).reshape(x.sizes());
  }
  return aten_orthogonalize(batch, schedule, dtype).to(out_dtype).contiguous().reshape(x.sizes());
}

at::Tensor orthogonalize_op(const at::Tensor& x, c10::string_view algorithm, at::ArrayRef<double> coefficients,
                            at::IntArrayRef restart_after, double eps, c10::string_view backend,
                            c10::string_view compute_dtype) {
  return translate_errors([&] {
    const auto schedule = make_schedule(std::string(algorithm), coefficients, restart_after, eps);
    return orthogonalize(x, schedule, std::string(backend), std::string(compute_dtype));
  });
}

}  // namespace
}  // namespace dmuon::torch_adapter

// NOTE: the namespace's one TORCH_LIBRARY (built in every build); the CUDA test ops add
// theirs as a fragment (testing_ops.cpp).
TORCH_LIBRARY(dmuon_testing, m) {
  m.def(
      "orthogonalize(Tensor x, str algorithm, float[] coefficients, int[] restart_after, "
      "float eps, str backend='auto', str compute_dtype='auto') -> Tensor");
#if defined(DMUON_HAS_CUDA_BACKEND)
  m.def("cuda_graph_stats(Tensor like) -> int[]");
#endif
}

TORCH_LIBRARY_IMPL(dmuon_testing, CompositeExplicitAutograd, m) {
  m.impl("orthogonalize", &dmuon::torch_adapter::orthogonalize_op);
}

#if defined(DMUON_HAS_CUDA_BACKEND)
TORCH_LIBRARY_IMPL(dmuon_testing, CUDA, m) { m.impl("cuda_graph_stats", &dmuon::torch_adapter::graph_stats_op); }
#endif
