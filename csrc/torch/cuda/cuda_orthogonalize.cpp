// dmuon/torch/cuda/cuda_orthogonalize.cpp — the CUDA backend on torch tensors.
#include "cuda_orthogonalize.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <list>
#include <memory>
#include <sstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/check.h"
#include "common/env.h"
#include "../orthogonalize.h"
#include "ns/cuda/autotune.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/sm90_sym_product.h"
#include "ns/cuda/cuda_backend.h"

namespace dmuon::torch_adapter {
namespace {

ns::cuda::DType to_dtype(at::ScalarType t) {
  DMUON_CHECK(t == at::kHalf || t == at::kBFloat16,
              "the CUDA backend iterates in float16 or bfloat16, not ", t);
  return t == at::kHalf ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
}

// A [B, rows, cols] view with row stride padded to 8 elements (TMA alignment).
at::Tensor padded(const at::Tensor& t) {
  const int64_t ld = ns::cuda::padded_ld(t.size(2));
  at::Tensor storage = at::zeros({t.size(0), t.size(1), ld}, t.options());
  at::Tensor view = storage.narrow(2, 0, t.size(2));
  view.copy_(t);
  return view;
}

ns::cuda::SymProductArgs sym_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                  const at::Tensor& d, double alpha, double beta) {
  ns::cuda::SymProductArgs args;
  args.dtype = to_dtype(a.scalar_type());
  args.batch = a.size(0), args.m = a.size(1), args.k = a.size(2);
  args.a = a.data_ptr(), args.lda = a.stride(1), args.stride_a = a.stride(0);
  args.b = b.data_ptr(), args.ldb = b.stride(1), args.stride_b = b.stride(0);
  if (c.defined()) args.c = c.data_ptr(), args.ldc = c.stride(1), args.stride_c = c.stride(0);
  args.d = d.data_ptr(), args.ldd = d.stride(1), args.stride_d = d.stride(0);
  args.alpha = alpha;
  args.beta = c.defined() ? beta : 0.0;
  return args;
}

// The kernel against the dense, mirrored cuBLASLt product on an odd-sized batch:
// every element close (fp32 accumulation, one rounding each) and the result exactly symmetric.
bool self_check(const at::Tensor& like, at::ScalarType dtype) {
  const int64_t batch = 3, m = 203, k = 333;
  // NOTE: inputs come from a private CPU generator so that the check leaves the user's
  // random streams (CPU and CUDA) untouched.
  at::Generator gen = at::detail::createCPUGenerator(/*seed_in=*/20261129);
  auto random = [&](at::IntArrayRef sizes, double scale) {
    return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat)).mul_(scale).to(like.device());
  };
  at::Tensor a = padded(random({batch, m, k}, 1.0 / std::sqrt(double(k))).to(dtype));
  at::Tensor b = padded(random({batch, m, k}, 1.0 / std::sqrt(double(k))).to(dtype));
  at::Tensor c0 = random({batch, m, m}, 1.0);
  at::Tensor c = padded((c0 + c0.transpose(1, 2)).to(dtype));
  at::Tensor kernel = cuda_sym_product(a, b, c, 0.75, -0.5, /*use_kernel=*/true).to(at::kFloat);
  at::Tensor dense = cuda_sym_product(a, b, c, 0.75, -0.5, /*use_kernel=*/false).to(at::kFloat);
  // The dense reference's lower triangle is the exact product; compare it there.
  at::Tensor lower = at::tril(at::ones({m, m}, like.options().dtype(at::kBool)));
  const double scale = dense.abs().max().item<double>();
  const double err = (kernel - dense).masked_select(lower).abs().max().item<double>();
  const bool symmetric = at::equal(kernel, kernel.transpose(1, 2));
  const double tol = (dtype == at::kHalf ? 4e-3 : 3e-2) * scale;
  if (!(err <= tol) || !symmetric) {
    TORCH_WARN("dmuon: the sm_90a symmetric kernel failed its self-check (", dtype, ": max error ",
               err, " vs tolerance ", tol, ", symmetric ", symmetric,
               "); falling back to the ATen backend");
    return false;
  }
  return true;
}

}  // namespace

bool cuda_sym_kernel_usable(const at::Tensor& x, at::ScalarType dtype) {
  if (!x.is_cuda() || (dtype != at::kHalf && dtype != at::kBFloat16)) return false;
  const int device = x.get_device();
  if (!ns::cuda::sym_kernel_supported(device)) return false;
  static std::mutex mutex;
  static std::map<std::pair<int, int>, bool> verdicts;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, static_cast<int>(dtype));
  auto it = verdicts.find(key);
  if (it != verdicts.end()) return it->second;
  bool ok = false;
  try {
    c10::cuda::CUDAGuard guard(x.device());
    ok = self_check(x, dtype);
  } catch (const std::exception& error) {
    TORCH_WARN("dmuon: the sm_90a symmetric kernel's self-check raised: ", error.what(),
               "; falling back to the ATen backend");
  }
  verdicts[key] = ok;
  return ok;
}

at::Tensor cuda_sym_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                            double alpha, double beta, bool use_kernel) {
  DMUON_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 3 && b.sizes() == a.sizes() &&
                  a.scalar_type() == b.scalar_type() && a.stride(2) == 1 && b.stride(2) == 1,
              "cuda_sym_product: A and B must be CUDA [B, m, k] tensors of one dtype with unit column stride");
  c10::cuda::CUDAGuard guard(a.device());
  const int64_t batch = a.size(0), m = a.size(1);
  at::Tensor d = at::empty({batch, m, ns::cuda::padded_ld(m)}, a.options()).narrow(2, 0, m);
  d.fill_(std::numeric_limits<double>::quiet_NaN());  // poisoned: every element must be written
  if (c.defined())
    DMUON_CHECK(c.sizes() == d.sizes() && c.scalar_type() == a.scalar_type() && c.stride(2) == 1,
                "cuda_sym_product: C must be [B, m, m] of A's dtype");
  ns::cuda::sym_product(sym_args(a, b, c, d, alpha, beta),
                        use_kernel ? ns::cuda::SymMode::kKernel : ns::cuda::SymMode::kDenseMirror,
                        at::cuda::getCurrentCUDAStream());
  return d;
}

// ---------------------------------------------------------------- CUDA graphs
// The iteration of one (device, stream, dtype, kernel, batch, shape, schedule) problem is
// captured once into a CUDA graph over a workspace kept with it, and replayed; the
// normalization (which reads the caller's input) and the write-back run outside it.
// NOTE: the first call of a problem runs eagerly (it tunes the configurations, which
// synchronizes); the second captures; later ones replay. Workspaces are kept up to
// DMUON_GRAPH_CACHE_MB (default 8192) in total, least recently used evicted first.
namespace {

struct GraphEntry {
  at::Tensor workspace;
  size_t bytes = 0;
  int calls = 0;
  bool capture_failed = false;
  cudaGraphExec_t exec = nullptr;
  void* result = nullptr;
  ~GraphEntry() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

struct GraphCache {
  std::mutex mutex;
  std::list<std::pair<std::string, std::unique_ptr<GraphEntry>>> entries;  // most recent first
  size_t total_bytes = 0;
  int64_t num_captures = 0, num_replays = 0;
};

GraphCache& graph_cache() {
  static GraphCache cache;
  return cache;
}

std::string graph_key(const ns::Schedule& schedule, at::ScalarType dtype, bool use_kernel, int64_t num,
                      int64_t rows, int64_t cols, const at::Tensor& like, cudaStream_t stream) {
  std::ostringstream key;
  key.precision(17);
  key << like.get_device() << "|" << reinterpret_cast<uintptr_t>(stream) << "|" << dtype << "|" << use_kernel
      << "|" << num << "x" << rows << "x" << cols << "|" << ns::algorithm_name(schedule.algorithm) << "|"
      << schedule.eps;
  for (const auto& c : schedule.steps) key << "|" << c.a << "," << c.b << "," << c.c;
  key << "|r";
  for (int r : schedule.restart_after) key << r << ",";
  return key.str();
}

// A private non-blocking stream per device to capture on.
// NOTE: the caller's stream may be the legacy default stream, which cannot capture
// (cudaErrorStreamCaptureUnsupported: every graph test failed so on the H200, 2026-11-29);
// capturing runs nothing, so the graph is recorded on this stream and launched on the
// caller's, in the caller's stream order.
cudaStream_t capture_stream(int device) {
  static std::mutex mutex;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t& s = streams[device];
  if (s == nullptr) DMUON_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// Capture the iteration into entry.exec; false (and the stream left usable) on failure.
bool capture(GraphEntry& entry, const ns::Schedule& schedule, ns::cuda::DType dtype, ns::cuda::SymMode mode,
             int64_t num, int64_t rows, int64_t cols, int device) {
  cudaStream_t stream = capture_stream(device);
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  void* result = nullptr;
  bool ok = true;
  try {
    result = ns::cuda::orthogonalize_iterate(schedule, dtype, mode, num, rows, cols,
                                             entry.workspace.data_ptr(), entry.bytes, stream);
  } catch (const std::exception&) {
    ok = false;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
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

}  // namespace

at::Tensor orthogonalize_cuda(const at::Tensor& batch, const ns::Schedule& schedule,
                              at::ScalarType dtype, bool use_kernel, bool graphs) {
  DMUON_CHECK(batch.is_cuda() && batch.dim() == 3, "orthogonalize_cuda: expected a CUDA [B, m, n] tensor");
  c10::cuda::CUDAGuard guard(batch.device());
  const int64_t num = batch.size(0), rows = batch.size(1), cols = batch.size(2);
  at::Tensor input = batch.to(at::kFloat).contiguous();
  at::Tensor output = at::empty({num, rows, cols}, input.options());
  at::Tensor sum_squares = at::empty({num}, input.options());
  const ns::cuda::DType half = to_dtype(dtype);
  const float* in = input.data_ptr<float>();
  float* out = output.data_ptr<float>();
  float* sums = sum_squares.data_ptr<float>();
  orthogonalize_cuda_prepared(
      num, rows, cols, schedule, dtype, use_kernel, input,
      [&](void* x, int64_t ld, cudaStream_t stream) {
        ns::cuda::prepare_packed(schedule, half, in, num, rows, cols, sums, x, ld, stream);
      },
      [&](const void* result, int64_t, cudaStream_t stream) {
        ns::cuda::orthogonalize_finish(half, result, num, rows, cols, out, stream);
      },
      graphs);
  return output;
}

void orthogonalize_cuda_prepared(int64_t num, int64_t rows, int64_t cols, const ns::Schedule& schedule,
                                 at::ScalarType dtype, bool use_kernel, const at::Tensor& like,
                                 const ns::cuda::PrepareIterate& prepare, const FinishResult& finish, bool graphs) {
  DMUON_CHECK(like.is_cuda(), "orthogonalize_cuda_prepared: expected a CUDA tensor to place the workspace");
  DMUON_CHECK(num >= 1 && rows >= 1 && cols >= 1, "orthogonalize_cuda_prepared: invalid batch [", num, ", ",
              rows, ", ", cols, "]");
  c10::cuda::CUDAGuard guard(like.device());
  const size_t bytes = ns::cuda::workspace_bytes(schedule.algorithm, num, rows, cols);
  const auto mode = use_kernel ? ns::cuda::SymMode::kKernel : ns::cuda::SymMode::kDenseMirror;
  const ns::cuda::DType half = to_dtype(dtype);
  const int64_t ld = ns::cuda::padded_ld(std::max(rows, cols));
  const at::TensorOptions bytes_options = like.options().dtype(at::kByte);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto eager = [&](void* ws) {
    finish(ns::cuda::orthogonalize_prepared(schedule, half, mode, num, rows, cols, ws, bytes, stream, prepare), ld,
           stream);
  };

  const size_t budget = static_cast<size_t>(std::max<int64_t>(0, env::kGraphCacheMb.get())) << 20;
  if (!graphs || bytes > budget || ns::cuda::stream_is_capturing(stream)) {
    // NOTE: the caching allocator's blocks are 512-byte aligned, more than the 256 needed.
    at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, bytes_options);
    eager(workspace.data_ptr());
    return;
  }

  GraphCache& cache = graph_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const std::string key = graph_key(schedule, dtype, use_kernel, num, rows, cols, like, stream);
  auto it = cache.entries.begin();
  while (it != cache.entries.end() && it->first != key) ++it;
  if (it == cache.entries.end()) {
    // Make room (least recently used last), then keep a workspace for this problem.
    while (!cache.entries.empty() && cache.total_bytes + bytes > budget) {
      cache.total_bytes -= cache.entries.back().second->bytes;
      cache.entries.pop_back();
    }
    auto entry = std::make_unique<GraphEntry>();
    entry->bytes = bytes;
    entry->workspace = at::empty({static_cast<int64_t>(bytes)}, bytes_options);
    cache.total_bytes += bytes;
    cache.entries.emplace_front(key, std::move(entry));
  } else if (it != cache.entries.begin()) {
    cache.entries.splice(cache.entries.begin(), cache.entries, it);
  }
  GraphEntry& entry = *cache.entries.front().second;
  void* ws = entry.workspace.data_ptr();
  if (entry.calls++ == 0 || entry.capture_failed) {
    eager(ws);
    return;
  }
  prepare(ns::cuda::iterate_buffer(schedule, num, rows, cols, ws, bytes), ld, stream);
  if (entry.exec == nullptr) {
    if (!capture(entry, schedule, half, mode, num, rows, cols, like.get_device())) {
      entry.capture_failed = true;
      TORCH_WARN_ONCE("dmuon: CUDA-graph capture of the Newton–Schulz iteration failed; running it eagerly");
      finish(ns::cuda::orthogonalize_iterate(schedule, half, mode, num, rows, cols, ws, bytes, stream), ld, stream);
      return;
    }
    ++cache.num_captures;
  }
  DMUON_CHECK_CUDA(cudaGraphLaunch(entry.exec, stream));
  ++cache.num_replays;
  finish(entry.result, ld, stream);
}

std::vector<int64_t> cuda_graph_stats() {
  GraphCache& cache = graph_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return {static_cast<int64_t>(cache.entries.size()), cache.num_captures, cache.num_replays,
          static_cast<int64_t>(cache.total_bytes)};
}

}  // namespace dmuon::torch_adapter

// Test-facing ops (registered only in CUDA builds): torch.ops.dmuon.cuda_sym_product and
// torch.ops.dmuon.cuda_sym_kernel_usable.
namespace {

at::Tensor cuda_sym_product_op(const at::Tensor& a, const at::Tensor& b,
                               const std::optional<at::Tensor>& c, double alpha, double beta,
                               bool use_kernel) {
  try {
    return dmuon::torch_adapter::cuda_sym_product(a, b, c.has_value() ? *c : at::Tensor(), alpha,
                                                  beta, use_kernel);
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

at::Tensor cuda_sym_product_config_op(const at::Tensor& a, const at::Tensor& b,
                                      const std::optional<at::Tensor>& c, double alpha, double beta,
                                      c10::string_view config, bool poison) {
  try {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 3 && b.sizes() == a.sizes() &&
                    a.scalar_type() == b.scalar_type() && a.stride(2) == 1 && b.stride(2) == 1,
                "cuda_sym_product_config: A and B must be CUDA [B, m, k] tensors of one dtype with unit column stride");
    c10::cuda::CUDAGuard guard(a.device());
    const int64_t batch = a.size(0), m = a.size(1);
    at::Tensor d = at::empty({batch, m, dmuon::ns::cuda::padded_ld(m)}, a.options()).narrow(2, 0, m);
    // NOTE: poisoned for the tests (every element must be written); the benchmarks turn it
    // off so that the timed call holds the product alone, as cuBLAS's does.
    if (poison) d.fill_(std::numeric_limits<double>::quiet_NaN());
    const at::Tensor cc = c.has_value() ? *c : at::Tensor();
    TORCH_CHECK(!cc.defined() || (cc.sizes() == d.sizes() && cc.scalar_type() == a.scalar_type() && cc.stride(2) == 1),
                "cuda_sym_product_config: C must be [B, m, m] of A's dtype");
    dmuon::ns::cuda::SymProductArgs args = dmuon::torch_adapter::sym_args(a, b, cc, d, alpha, beta);
    // NOTE: cuBLASLt candidates ("lt:<i>") get a scratch workspace like the backend's.
    constexpr size_t kLtBytes = dmuon::ns::cuda::kCublasWorkspaceBytes;
    at::Tensor lt_ws = at::empty({static_cast<int64_t>(kLtBytes)}, a.options().dtype(at::kByte));
    dmuon::ns::cuda::sym_product_with(args, std::string(config), lt_ws.data_ptr(), kLtBytes,
                                      at::cuda::getCurrentCUDAStream());
    return d;
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

std::vector<std::string> cuda_sym_configs_op() {
  std::vector<std::string> names;
  if (!dmuon::ns::cuda::sym_kernel_built()) return names;
  for (const auto& c : dmuon::ns::cuda::sm90_sym_configs()) names.push_back(c.name());
  return names;
}

// The largest batch of rows×cols matrices whose NS workspace fits the step's NS batch bound
// (DMUON_NS_BATCH_MB, read at each call): the biggest batch a step runs at this shape, so
// the largest batch worth profiling for the planner's cost table.
// NOTE: the profiler timed batches of every matrix of a shape (28 of 3584×18944 for
// Qwen2.5-7B), which is where the 56.5 GB first-step peak of rank 0 came from (issue 26).
int64_t cuda_ns_batch_capacity_op(c10::string_view algorithm, int64_t rows, int64_t cols) {
  try {
    DMUON_CHECK(rows >= 1 && cols >= 1, "cuda_ns_batch_capacity: rows and cols must be >= 1, got ", rows, "x", cols);
    const int64_t limit_mb = dmuon::env::get_int("DMUON_NS_BATCH_MB", 2048);
    DMUON_CHECK(limit_mb >= 1, "DMUON_NS_BATCH_MB must be at least 1, got ", limit_mb);
    const auto alg = dmuon::ns::parse_algorithm(std::string(algorithm));
    const size_t limit = static_cast<size_t>(limit_mb) << 20;
    // Doubling, then bisection: workspace_bytes grows with the batch.
    int64_t lo = 1, hi = 1;
    while (hi < (int64_t{1} << 20) && dmuon::ns::cuda::workspace_bytes(alg, hi * 2, rows, cols) <= limit) hi *= 2;
    lo = hi;
    hi = hi * 2;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (dmuon::ns::cuda::workspace_bytes(alg, mid, rows, cols) <= limit ? lo : hi) = mid;
    }
    return lo;
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

double cuda_ns_tuned_ms_op(const at::Tensor& like, int64_t rows, int64_t cols, int64_t batch,
                           c10::string_view algorithm, at::ArrayRef<double> coefficients,
                           at::IntArrayRef restart_after, double eps, c10::string_view dtype, bool use_kernel) {
  try {
    c10::cuda::CUDAGuard guard(like.device());
    const auto schedule = dmuon::torch_adapter::make_schedule(std::string(algorithm), coefficients, restart_after, eps);
    TORCH_CHECK(dtype == "float16" || dtype == "bfloat16", "dtype must be float16 or bfloat16");
    return dmuon::ns::cuda::tuned_ns_ms(rows, cols, batch,
                                        dtype == "float16" ? dmuon::ns::cuda::DType::kFloat16
                                                           : dmuon::ns::cuda::DType::kBFloat16,
                                        schedule,
                                        use_kernel ? dmuon::ns::cuda::SymMode::kKernel
                                                   : dmuon::ns::cuda::SymMode::kDenseMirror);
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

int64_t cuda_autotune_measurements_op(const at::Tensor&) {
  return dmuon::ns::cuda::Autotuner::instance().num_measurements();
}

std::vector<int64_t> cuda_graph_stats_op(const at::Tensor&) { return dmuon::torch_adapter::cuda_graph_stats(); }

// The time in ms of every algorithm cuBLASLt's heuristic offers for D = A·op(B) + β·C
// (A [batch, m, k]; B [batch, k, n], or [batch, n, k] when transpose_b), timed in turns as the
// autotuner times its candidates; NaN for an algorithm that failed to run.
// NOTE: for the benchmarks' floor at GEMM rates: the results are not checked, so a wrong
// but fast algorithm could only lower that floor.
std::vector<double> cuda_gemm_algo_ms_op(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                                         double beta, bool transpose_b) {
  try {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 3 && b.dim() == 3 && a.is_contiguous() && b.is_contiguous() &&
                    a.scalar_type() == b.scalar_type() &&
                    (a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16),
                "cuda_gemm_algo_ms: A and B must be contiguous CUDA [batch, rows, cols] tensors, both float16 or "
                "both bfloat16");
    c10::cuda::CUDAGuard guard(a.device());
    dmuon::ns::cuda::GemmDesc g;
    g.dtype = a.scalar_type() == at::kHalf ? dmuon::ns::cuda::DType::kFloat16 : dmuon::ns::cuda::DType::kBFloat16;
    g.transpose_b = transpose_b;
    g.batch = a.size(0), g.m = a.size(1), g.k = a.size(2);
    g.n = transpose_b ? b.size(1) : b.size(2);
    TORCH_CHECK(b.size(0) == g.batch && (transpose_b ? b.size(2) : b.size(1)) == g.k,
                "cuda_gemm_algo_ms: B must be [", g.batch, ", ", transpose_b ? "n, " : "", g.k, transpose_b ? "" : ", n",
                "] for A of shape ", a.sizes());
    const bool has_c = c.has_value() && beta != 0.0;
    TORCH_CHECK(!has_c || (c->is_contiguous() && c->scalar_type() == a.scalar_type() &&
                           c->sizes() == at::IntArrayRef({g.batch, g.m, g.n})),
                "cuda_gemm_algo_ms: C must be a contiguous [batch, m, n] tensor of A's dtype");
    g.lda = g.k, g.stride_a = g.m * g.k;
    g.ldb = transpose_b ? g.k : g.n, g.stride_b = g.n * g.k;
    g.ldc = g.ldd = g.n, g.stride_c = g.stride_d = g.m * g.n;
    at::Tensor d = at::empty({g.batch, g.m, g.n}, a.options());
    constexpr size_t kWorkspaceBytes = dmuon::ns::cuda::kCublasWorkspaceBytes;  // NOTE: as the backend's
    at::Tensor workspace = at::empty({static_cast<int64_t>(kWorkspaceBytes)}, a.options().dtype(at::kByte));
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const void* c_ptr = has_c ? c->data_ptr() : nullptr;
    std::vector<std::function<void()>> runs;
    for (int algo = 0; algo < dmuon::ns::cuda::gemm_num_algos(g, has_c, kWorkspaceBytes); ++algo) {
      runs.push_back([=, &g, &a, &b, &d, &workspace] {
        dmuon::ns::cuda::gemm(g, 1.0, a.data_ptr(), b.data_ptr(), has_c ? beta : 0.0, c_ptr, d.data_ptr(),
                              workspace.data_ptr(), kWorkspaceBytes, stream, algo);
      });
    }
    std::vector<std::string> errors;
    return dmuon::ns::cuda::time_in_turns(runs, stream, &errors);
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

bool cuda_sym_kernel_usable_op(const at::Tensor& x, c10::string_view dtype) {
  TORCH_CHECK(dtype == "float16" || dtype == "bfloat16", "dtype must be float16 or bfloat16");
  return dmuon::torch_adapter::cuda_sym_kernel_usable(x, dtype == "float16" ? at::kHalf : at::kBFloat16);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dmuon, m) {
  m.def("cuda_sym_product(Tensor a, Tensor b, Tensor? c, float alpha, float beta, bool use_kernel) -> Tensor");
  m.def("cuda_sym_kernel_usable(Tensor x, str dtype) -> bool");
  m.def(
      "cuda_sym_product_config(Tensor a, Tensor b, Tensor? c, float alpha, float beta, str config, bool poison=True) "
      "-> Tensor");
  m.def("cuda_sym_configs() -> str[]", &cuda_sym_configs_op);
  m.def("cuda_ns_batch_capacity(str algorithm, int rows, int cols) -> int", &cuda_ns_batch_capacity_op);
  m.def("cuda_ns_tuned_ms(Tensor like, int rows, int cols, int batch, str algorithm, float[] coefficients, "
        "int[] restart_after, float eps, str dtype, bool use_kernel) -> float");
  m.def("cuda_autotune_measurements(Tensor like) -> int");
  m.def("cuda_graph_stats(Tensor like) -> int[]");
  m.def("cuda_gemm_algo_ms(Tensor a, Tensor b, Tensor? c, float beta, bool transpose_b) -> float[]");
}

TORCH_LIBRARY_IMPL(dmuon, CUDA, m) {
  m.impl("cuda_sym_product", &cuda_sym_product_op);
  m.impl("cuda_sym_kernel_usable", &cuda_sym_kernel_usable_op);
  m.impl("cuda_sym_product_config", &cuda_sym_product_config_op);
  m.impl("cuda_ns_tuned_ms", &cuda_ns_tuned_ms_op);
  m.impl("cuda_autotune_measurements", &cuda_autotune_measurements_op);
  m.impl("cuda_graph_stats", &cuda_graph_stats_op);
  m.impl("cuda_gemm_algo_ms", &cuda_gemm_algo_ms_op);
}
