// cutlass_tile_probe.cu -- standalone tile-shape probe for the dense "X·Xᵀ" product.
//
// Question answered:
//   For D = A·Bᵀ with A = B = X (fp16, X row-major m×k, i.e. both operands K-major, "NT"),
//   fp32 accumulation, fp16 output, how fast are CUTLASS 3.x's own sm90 TMA warp-specialized
//   GEMMs at different CTA tile / cluster shapes (128x128, 128x256, 256x128; cluster 1x1 / 2x1;
//   cooperative vs ping-pong), and which algorithm / tile / cluster / stages does cuBLASLt's
//   heuristic pick for the same problem?  Used to decide whether our symmetric kernel
//   (128x128x64 tiles, 2 consumer warpgroups) should move to 128x256 tiles.
//
//   Default problems (batch 1): 3584x18944, 4096x14336, 3584x3584  (written m x k; n = m).
//   Every CUTLASS result is compared against cuBLASLt's output over the whole D, and every
//   result (cuBLASLt included) against an fp32 naive dot product on 4096 sampled entries.
//   Timing: CUDA events around each launch, W warm-ups, median of N launches, no L2 flush.
//   TFLOP/s = 2*m*m*k*batch / time (the full dense product, not the symmetric half).
//
// Build (no GPU needed to compile; CUTLASS/CuTe 4.2 headers from .cutlass/include):
//   mkdir -p /work/main/build/probe && nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a \
//     --expt-relaxed-constexpr -I/work/main/.cutlass/include -lcublasLt -lcublas \
//     -o /work/main/build/probe/cutlass_tile_probe /work/main/lab/kernels/cutlass_tile_probe.cu
//
// NOTE: -DNDEBUG matters: without it CUTLASS's device-side asserts are function calls inside
// the mainloop and ptxas serializes every instance's WGMMAs (C7510). The run-G figures of
// docs/benchmarks/history.md came from such a build.
//
// Run (on an H100/H200):
//   build/probe/cutlass_tile_probe                                   # the three default problems, batch 1
//   build/probe/cutlass_tile_probe --iters 50 3584x18944 3584x18944x7 # MxK or MxKxBATCH
//   options: --iters N (timed launches, default 20)  --warmup N (default 3)
//            --batch L (batch for problems given without xL, default 1)

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"

// ----------------------------------------------------------------------------------------------
// Small utilities
// ----------------------------------------------------------------------------------------------

static std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
static std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return std::string(buf);
}

// Evaluate a CUDA call; on failure store a message in `err` and return false from the caller.
#define CU_OK(call)                                                                        \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      err = fmt("%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      return false;                                                                        \
    }                                                                                      \
  } while (0)

#define LT_OK(call)                                                                        \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      err = fmt("%s failed: status %d (%s:%d)", #call, int(s_), __FILE__, __LINE__);       \
      return false;                                                                        \
    }                                                                                      \
  } while (0)

struct Problem {
  int m = 0;  // rows of X (= M = N of the product)
  int k = 0;  // cols of X (reduction length)
  int l = 1;  // batch
  std::string name() const { return fmt("%dx%d b%d", m, k, l); }
  double flops() const { return 2.0 * double(m) * double(m) * double(k) * double(l); }
};

struct Result {
  std::string problem;
  std::string method;
  bool ran = false;
  double ms = 0.0;
  double tflops = 0.0;
  std::string check;  // "ok" / "MISMATCH ..." / "-"
  std::string note;   // extra info (stages, smem, grid) or the failure reason
};

struct Options {
  int iters = 20;
  int warmup = 3;
  int batch = 1;
  std::vector<Problem> problems;
};

// ----------------------------------------------------------------------------------------------
// Device helpers: init, naive sampled reference, full compare
// ----------------------------------------------------------------------------------------------

__host__ __device__ inline uint32_t mix32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return uint32_t(x);
}

// Uniform in [-1, 1] times `scale`.  scale = k^(-1/4) keeps off-diagonal entries of X·Xᵀ at
// O(1/3) and the diagonal at O(sqrt(k)/3), so index errors anywhere in D are detectable.
__global__ void init_uniform(__half* x, size_t n, float scale, uint64_t seed) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float u = float(mix32(i * 0x9E3779B97F4A7C15ULL + seed)) * (1.0f / 4294967296.0f);
    x[i] = __float2half((2.0f * u - 1.0f) * scale);
  }
}

// Per-entry tolerance for an fp16 output of an fp32-accumulated dot product.
__device__ inline bool close_enough(float got, float want) {
  float d = fabsf(got - want);
  return d <= 1e-2f * fabsf(want) + 1e-2f;  // NaN -> false
}

struct CheckStats {
  unsigned long long bad;
  unsigned int max_diff_bits;  // float bits of max |got - want| (non-negative floats order as ints)
  unsigned int max_ref_bits;   // float bits of max |want|
};

// One block per sampled entry (b, i, j): fp32 dot product of rows i and j of X[b], compared to D[b](i, j).
__global__ void sample_check(const __half* X, const __half* D, int m, int k, int l, int nsamples,
                             uint64_t seed, CheckStats* st) {
  int s = blockIdx.x;
  if (s >= nsamples) return;
  uint32_t h1 = mix32(seed + 3ULL * s + 1), h2 = mix32(seed + 3ULL * s + 2), h3 = mix32(seed + 3ULL * s + 3);
  int b = int(h3 % uint32_t(l));
  int i = int(h1 % uint32_t(m));
  int j = (s < 64) ? i : int(h2 % uint32_t(m));  // a few diagonal entries too
  if (s == 64) { i = 0; j = m - 1; }             // and the two far corners
  if (s == 65) { i = m - 1; j = 0; }
  const __half* xi = X + (size_t(b) * m + i) * k;
  const __half* xj = X + (size_t(b) * m + j) * k;
  float acc = 0.f;
  for (int t = threadIdx.x; t < k; t += blockDim.x) acc += __half2float(xi[t]) * __half2float(xj[t]);
  __shared__ float red[32];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float want = 0.f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) want += red[w];
    float got = __half2float(D[(size_t(b) * m + i) * m + j]);
    float d = fabsf(got - want);
    if (!close_enough(got, want)) atomicAdd(&st->bad, 1ULL);
    if (d != d) d = INFINITY;
    atomicMax(&st->max_diff_bits, __float_as_uint(d));
    atomicMax(&st->max_ref_bits, __float_as_uint(fabsf(want)));
  }
}

// Element-wise comparison of two whole outputs.
__global__ void full_compare(const __half* got, const __half* want, size_t n, CheckStats* st) {
  unsigned long long bad = 0;
  float md = 0.f, mr = 0.f;
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = __half2float(got[i]), w = __half2float(want[i]);
    float d = fabsf(g - w);
    if (d != d) d = INFINITY;
    if (!close_enough(g, w)) ++bad;
    md = fmaxf(md, d);
    mr = fmaxf(mr, fabsf(w));
  }
  for (int o = 16; o > 0; o >>= 1) {
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
    md = fmaxf(md, __shfl_xor_sync(0xffffffffu, md, o));
    mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, o));
  }
  if ((threadIdx.x & 31) == 0) {
    if (bad) atomicAdd(&st->bad, bad);
    atomicMax(&st->max_diff_bits, __float_as_uint(md));
    atomicMax(&st->max_ref_bits, __float_as_uint(mr));
  }
}

static float bits_to_float(unsigned int b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// Checks D (l × m × m) against the sampled fp32 reference and, when given, the whole of Dref.
// Returns false only on a CUDA error; `verdict` gets "ok" or "MISMATCH ...".
static bool check_output(const Problem& p, const __half* X, const __half* D, const __half* Dref,
                         CheckStats* st_dev, std::string& verdict, std::string& err) {
  const int nsamples = 4096;
  CheckStats st{};
  CU_OK(cudaMemset(st_dev, 0, sizeof(CheckStats)));
  sample_check<<<nsamples, 256>>>(X, D, p.m, p.k, p.l, nsamples, 0x5eedULL, st_dev);
  CU_OK(cudaGetLastError());
  CU_OK(cudaMemcpy(&st, st_dev, sizeof(st), cudaMemcpyDeviceToHost));
  unsigned long long bad_sample = st.bad;
  float sample_err = bits_to_float(st.max_diff_bits) / std::max(bits_to_float(st.max_ref_bits), 1e-30f);

  unsigned long long bad_full = 0;
  float full_err = 0.f;
  if (Dref) {
    CU_OK(cudaMemset(st_dev, 0, sizeof(CheckStats)));
    full_compare<<<1024, 256>>>(D, Dref, size_t(p.l) * p.m * p.m, st_dev);
    CU_OK(cudaGetLastError());
    CU_OK(cudaMemcpy(&st, st_dev, sizeof(st), cudaMemcpyDeviceToHost));
    bad_full = st.bad;
    full_err = bits_to_float(st.max_diff_bits) / std::max(bits_to_float(st.max_ref_bits), 1e-30f);
  }
  if (bad_sample == 0 && bad_full == 0) {
    verdict = Dref ? fmt("ok (maxdiff/maxref %.1e)", full_err) : fmt("ok (sampled, %.1e)", sample_err);
  } else {
    verdict = fmt("MISMATCH (sample bad %llu/%d err %.1e; full bad %llu err %.1e)", bad_sample, nsamples,
                  sample_err, bad_full, full_err);
  }
  return true;
}

// Runs `launch` warmup + iters times, timing each timed launch with CUDA events; median in ms.
static bool time_median(const std::function<bool(std::string&)>& launch, int warmup, int iters,
                        double& median_ms, std::string& err) {
  cudaEvent_t e0, e1;
  CU_OK(cudaEventCreate(&e0));
  CU_OK(cudaEventCreate(&e1));
  bool ok = true;
  std::vector<float> t;
  for (int it = 0; it < warmup + iters && ok; ++it) {
    if (cudaEventRecord(e0) != cudaSuccess) { err = "cudaEventRecord failed"; ok = false; break; }
    if (!launch(err)) { ok = false; break; }
    cudaError_t e = cudaEventRecord(e1);
    if (e == cudaSuccess) e = cudaEventSynchronize(e1);
    if (e != cudaSuccess) { err = fmt("kernel/event failure: %s", cudaGetErrorString(e)); ok = false; break; }
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (it >= warmup) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (!ok) return false;
  std::sort(t.begin(), t.end());
  median_ms = t.empty() ? 0.0 : (t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]));
  return true;
}

// Poisons `out` with NaN (0xFFFF), runs `launch` once and checks `out` (against `ref` too
// when given), then times it; fills r.check, r.ms, r.tflops. False on a CUDA or launch error.
static bool check_then_time(const Problem& p, const std::function<bool(std::string&)>& launch, const __half* X,
                            __half* out, const __half* ref, CheckStats* st, const Options& opt, Result& r,
                            std::string& err) {
  CU_OK(cudaMemset(out, 0xFF, size_t(p.l) * p.m * p.m * sizeof(__half)));
  if (!launch(err)) return false;
  CU_OK(cudaDeviceSynchronize());
  if (!check_output(p, X, out, ref, st, r.check, err)) return false;
  double ms = 0.0;
  if (!time_median(launch, opt.warmup, opt.iters, ms, err)) return false;
  r.ran = true;
  r.ms = ms;
  r.tflops = p.flops() / (ms * 1e-3) / 1e12;
  return true;
}

// ----------------------------------------------------------------------------------------------
// CUTLASS sm90 warp-specialized GEMM instances
// ----------------------------------------------------------------------------------------------

// Packed stride for a "K-major"/row-major-like operand: Stride<int64_t, _1, int64_t> over (rows, cols, batch).
template <class StrideT>
static StrideT unit_col_stride(int64_t rows, int64_t cols, int batch) {
  using Mode1 = cute::remove_cvref_t<decltype(cute::get<1>(StrideT{}))>;
  static_assert(cute::is_same_v<Mode1, cute::Int<1>>, "expected a unit stride in mode 1");
  StrideT s{};
  cute::get<0>(s) = cols;
  cute::get<2>(s) = (batch > 1) ? rows * cols : 0;
  return s;
}

template <int TM, int TN, int TK, int CM, int CN, class KernelSchedule, class EpilogueSchedule>
struct CutlassInstance {
  using ElementA = cutlass::half_t;
  using ElementB = cutlass::half_t;
  using ElementC = cutlass::half_t;
  using ElementD = cutlass::half_t;
  using ElementAcc = float;
  using ElementCompute = float;
  using LayoutA = cutlass::layout::RowMajor;     // X: m × k, K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // Xᵀ viewed as k × n column-major == X row-major
  using LayoutC = cutlass::layout::RowMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<cutlass::half_t>::value;  // 8 elements

  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementCompute,
      ElementC, LayoutC, kAlign, ElementD, LayoutD, kAlign, EpilogueSchedule>::CollectiveOp;

  using StageCount = cutlass::gemm::collective::StageCountAutoCarveout<
      static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlign, ElementB, LayoutB,
      kAlign, ElementAcc, TileShape, ClusterShape, StageCount, KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue>;  // default (persistent) scheduler
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static Result run(const Problem& p, const __half* X, __half* D, const __half* Dref, CheckStats* st,
                    int sm_count, const Options& opt, const std::string& label) {
    Result r;
    r.problem = p.name();
    r.method = label;
    std::string err;
    if (!run_impl(p, X, D, Dref, st, sm_count, opt, r, err)) {
      r.ran = false;
      r.note = "FAILED: " + err;
      cudaGetLastError();  // clear a sticky-free error so later instances can still run
    }
    return r;
  }

  static bool run_impl(const Problem& p, const __half* X, __half* D, const __half* Dref, CheckStats* st,
                       int sm_count, const Options& opt, Result& r, std::string& err) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;

    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = cute::make_shape(p.m, p.m, p.k, p.l);
    args.mainloop.ptr_A = reinterpret_cast<const ElementA*>(X);
    args.mainloop.dA = unit_col_stride<StrideA>(p.m, p.k, p.l);
    args.mainloop.ptr_B = reinterpret_cast<const ElementB*>(X);
    args.mainloop.dB = unit_col_stride<StrideB>(p.m, p.k, p.l);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = reinterpret_cast<const ElementC*>(D);  // unused with beta = 0
    args.epilogue.dC = unit_col_stride<StrideC>(p.m, p.m, p.l);
    args.epilogue.ptr_D = reinterpret_cast<ElementD*>(D);
    args.epilogue.dD = unit_col_stride<StrideD>(p.m, p.m, p.l);
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sm_count;

    Gemm gemm;
    cutlass::Status s = gemm.can_implement(args);
    if (s != cutlass::Status::kSuccess) {
      err = fmt("can_implement: %s", cutlass::cutlassGetStatusString(s));
      return false;
    }
    size_t ws_bytes = Gemm::get_workspace_size(args);
    void* ws = nullptr;
    if (ws_bytes) CU_OK(cudaMalloc(&ws, ws_bytes));
    struct Free { void* p; ~Free() { if (p) cudaFree(p); } } ws_guard{ws};

    s = gemm.initialize(args, ws);
    if (s != cutlass::Status::kSuccess) {
      err = fmt("initialize: %s", cutlass::cutlassGetStatusString(s));
      return false;
    }
    dim3 grid = Gemm::get_grid_shape(args, ws);
    r.note = fmt("stages=%d smem=%dB grid=%ux%ux%u ws=%zuB", int(CollectiveMainloop::DispatchPolicy::Stages),
                 int(GemmKernel::SharedStorageSize), grid.x, grid.y, grid.z, ws_bytes);

    auto launch = [&](std::string& e) -> bool {
      cutlass::Status ls = gemm.run();
      if (ls != cutlass::Status::kSuccess) {
        e = fmt("run: %s", cutlass::cutlassGetStatusString(ls));
        return false;
      }
      cudaError_t ce = cudaGetLastError();
      if (ce != cudaSuccess) {
        e = fmt("launch: %s", cudaGetErrorString(ce));
        return false;
      }
      return true;
    };

    return check_then_time(p, launch, X, D, Dref, st, opt, r, err);
  }
};

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingpongEpi = cutlass::epilogue::TmaWarpSpecialized;

using Inst_128x128_c1_coop = CutlassInstance<128, 128, 64, 1, 1, Coop, CoopEpi>;
using Inst_128x128_c2_coop = CutlassInstance<128, 128, 64, 2, 1, Coop, CoopEpi>;
using Inst_128x256_c1_coop = CutlassInstance<128, 256, 64, 1, 1, Coop, CoopEpi>;
using Inst_128x256_c2_coop = CutlassInstance<128, 256, 64, 2, 1, Coop, CoopEpi>;
using Inst_256x128_c1_coop = CutlassInstance<256, 128, 64, 1, 1, Coop, CoopEpi>;
using Inst_128x128_c1_pp = CutlassInstance<128, 128, 64, 1, 1, Pingpong, PingpongEpi>;

// ----------------------------------------------------------------------------------------------
// cuBLASLt
// ----------------------------------------------------------------------------------------------

struct EnumName {
  int value;
  const char* name;
};

// Generated from CUDA 13.0's cublasLt.h (cublasLtMatmulTile_t); values come from the header itself.
#define T(n) {int(CUBLASLT_MATMUL_TILE_##n), #n},
static const EnumName kTileNames[] = {
  T(UNDEFINED) T(8x8) T(8x16) T(16x8) T(8x32) T(16x16) T(32x8) T(8x64) T(16x32) T(32x16) T(64x8)
  T(32x32) T(32x64) T(64x32) T(32x128) T(64x64) T(128x32) T(64x128) T(128x64) T(64x256) T(128x128)
  T(256x64) T(64x512) T(128x256) T(256x128) T(512x64) T(64x96) T(96x64) T(96x128) T(128x160)
  T(160x128) T(192x128) T(128x192) T(128x96) T(32x256) T(256x32) T(8x128) T(8x192) T(8x256)
  T(8x320) T(8x384) T(8x448) T(8x512) T(8x576) T(8x640) T(8x704) T(8x768) T(16x64) T(16x128)
  T(16x192) T(16x256) T(16x320) T(16x384) T(16x448) T(16x512) T(16x576) T(16x640) T(16x704)
  T(16x768) T(24x64) T(24x128) T(24x192) T(24x256) T(24x320) T(24x384) T(24x448) T(24x512)
  T(24x576) T(24x640) T(24x704) T(24x768) T(32x192) T(32x320) T(32x384) T(32x448) T(32x512)
  T(32x576) T(32x640) T(32x704) T(32x768) T(40x64) T(40x128) T(40x192) T(40x256) T(40x320)
  T(40x384) T(40x448) T(40x512) T(40x576) T(40x640) T(40x704) T(40x768) T(48x64) T(48x128)
  T(48x192) T(48x256) T(48x320) T(48x384) T(48x448) T(48x512) T(48x576) T(48x640) T(48x704)
  T(48x768) T(56x64) T(56x128) T(56x192) T(56x256) T(56x320) T(56x384) T(56x448) T(56x512)
  T(56x576) T(56x640) T(56x704) T(56x768) T(64x192) T(64x320) T(64x384) T(64x448) T(64x576)
  T(64x640) T(64x704) T(64x768) T(72x64) T(72x128) T(72x192) T(72x256) T(72x320) T(72x384)
  T(72x448) T(72x512) T(72x576) T(72x640) T(80x64) T(80x128) T(80x192) T(80x256) T(80x320)
  T(80x384) T(80x448) T(80x512) T(80x576) T(88x64) T(88x128) T(88x192) T(88x256) T(88x320)
  T(88x384) T(88x448) T(88x512) T(96x192) T(96x256) T(96x320) T(96x384) T(96x448) T(96x512)
  T(104x64) T(104x128) T(104x192) T(104x256) T(104x320) T(104x384) T(104x448) T(112x64) T(112x128)
  T(112x192) T(112x256) T(112x320) T(112x384) T(120x64) T(120x128) T(120x192) T(120x256) T(120x320)
  T(120x384) T(128x320) T(128x384) T(136x64) T(136x128) T(136x192) T(136x256) T(136x320) T(144x64)
  T(144x128) T(144x192) T(144x256) T(144x320) T(152x64) T(152x128) T(152x192) T(152x256) T(152x320)
  T(160x64) T(160x192) T(160x256) T(168x64) T(168x128) T(168x192) T(168x256) T(176x64) T(176x128)
  T(176x192) T(176x256) T(184x64) T(184x128) T(184x192) T(184x256) T(192x64) T(192x192) T(192x256)
  T(200x64) T(200x128) T(200x192) T(208x64) T(208x128) T(208x192) T(216x64) T(216x128) T(216x192)
  T(224x64) T(224x128) T(224x192) T(232x64) T(232x128) T(232x192) T(240x64) T(240x128) T(240x192)
  T(248x64) T(248x128) T(248x192) T(256x192) T(264x64) T(264x128) T(272x64) T(272x128) T(280x64)
  T(280x128) T(288x64) T(288x128) T(296x64) T(296x128) T(304x64) T(304x128) T(312x64) T(312x128)
  T(320x64) T(320x128) T(328x64) T(328x128) T(336x64) T(336x128) T(344x64) T(344x128) T(352x64)
  T(352x128) T(360x64) T(360x128) T(368x64) T(368x128) T(376x64) T(376x128) T(384x64) T(384x128)
  T(392x64) T(400x64) T(408x64) T(416x64) T(424x64) T(432x64) T(440x64) T(448x64) T(456x64)
  T(464x64) T(472x64) T(480x64) T(488x64) T(496x64) T(504x64) T(520x64) T(528x64) T(536x64)
  T(544x64) T(552x64) T(560x64) T(568x64) T(576x64) T(584x64) T(592x64) T(600x64) T(608x64)
  T(616x64) T(624x64) T(632x64) T(640x64) T(648x64) T(656x64) T(664x64) T(672x64) T(680x64)
  T(688x64) T(696x64) T(704x64) T(712x64) T(720x64) T(728x64) T(736x64) T(744x64) T(752x64)
  T(760x64) T(768x64) T(64x16) T(64x24) T(64x40) T(64x48) T(64x56) T(64x72) T(64x80) T(64x88)
  T(64x104) T(64x112) T(64x120) T(64x136) T(64x144) T(64x152) T(64x160) T(64x168) T(64x176)
  T(64x184) T(64x200) T(64x208) T(64x216) T(64x224) T(64x232) T(64x240) T(64x248) T(64x264)
  T(64x272) T(64x280) T(64x288) T(64x296) T(64x304) T(64x312) T(64x328) T(64x336) T(64x344)
  T(64x352) T(64x360) T(64x368) T(64x376) T(64x392) T(64x400) T(64x408) T(64x416) T(64x424)
  T(64x432) T(64x440) T(64x456) T(64x464) T(64x472) T(64x480) T(64x488) T(64x496) T(64x504)
  T(64x520) T(64x528) T(64x536) T(64x544) T(64x552) T(64x560) T(64x568) T(64x584) T(64x592)
  T(64x600) T(64x608) T(64x616) T(64x624) T(64x632) T(64x648) T(64x656) T(64x664) T(64x672)
  T(64x680) T(64x688) T(64x696) T(64x712) T(64x720) T(64x728) T(64x736) T(64x744) T(64x752)
  T(64x760) T(128x8) T(128x16) T(128x24) T(128x40) T(128x48) T(128x56) T(128x72) T(128x80)
  T(128x88) T(128x104) T(128x112) T(128x120) T(128x136) T(128x144) T(128x152) T(128x168) T(128x176)
  T(128x184) T(128x200) T(128x208) T(128x216) T(128x224) T(128x232) T(128x240) T(128x248)
  T(128x264) T(128x272) T(128x280) T(128x288) T(128x296) T(128x304) T(128x312) T(128x328)
  T(128x336) T(128x344) T(128x352) T(128x360) T(128x368) T(128x376) T(128x392) T(128x400)
  T(128x408) T(128x416) T(128x424) T(128x432) T(128x440) T(128x448) T(128x456) T(128x464)
  T(128x472) T(128x480) T(128x488) T(128x496) T(128x504) T(128x512) T(192x8) T(192x16) T(192x24)
  T(192x32) T(192x40) T(192x48) T(192x56) T(192x72) T(192x80) T(192x88) T(192x96) T(192x104)
  T(192x112) T(192x120) T(192x136) T(192x144) T(192x152) T(192x160) T(192x168) T(192x176)
  T(192x184) T(192x200) T(192x208) T(192x216) T(192x224) T(192x232) T(192x240) T(192x248)
  T(192x264) T(192x272) T(192x280) T(192x288) T(192x296) T(192x304) T(192x312) T(192x320)
  T(192x328) T(192x336) T(256x8) T(256x16) T(256x24) T(256x40) T(256x48) T(256x56) T(256x72)
  T(256x80) T(256x88) T(256x96) T(256x104) T(256x112) T(256x120) T(256x136) T(256x144) T(256x152)
  T(256x160) T(256x168) T(256x176) T(256x184) T(256x200) T(256x208) T(256x216) T(256x224)
  T(256x232) T(256x240) T(256x248) T(256x256) T(320x8) T(320x16) T(320x24) T(320x32) T(320x40)
  T(320x48) T(320x56) T(320x72) T(320x80) T(320x88) T(320x96) T(320x104) T(320x112) T(320x120)
  T(320x136) T(320x144) T(320x152) T(320x160) T(320x168) T(320x176) T(320x184) T(320x192)
  T(320x200) T(384x8) T(384x16) T(384x24) T(384x32) T(384x40) T(384x48) T(384x56) T(384x72)
  T(384x80) T(384x88) T(384x96) T(384x104) T(384x112) T(384x120) T(384x136) T(384x144) T(384x152)
  T(384x160) T(384x168) T(448x8) T(448x16) T(448x24) T(448x32) T(448x40) T(448x48) T(448x56)
  T(448x72) T(448x80) T(448x88) T(448x96) T(448x104) T(448x112) T(448x120) T(448x128) T(448x136)
  T(448x144) T(512x8) T(512x16) T(512x24) T(512x32) T(512x40) T(512x48) T(512x56) T(512x72)
  T(512x80) T(512x88) T(512x96) T(512x104) T(512x112) T(512x120) T(512x128) T(576x8) T(576x16)
  T(576x24) T(576x32) T(576x40) T(576x48) T(576x56) T(576x72) T(576x80) T(576x88) T(576x96)
  T(576x104) T(576x112) T(640x8) T(640x16) T(640x24) T(640x32) T(640x40) T(640x48) T(640x56)
  T(640x72) T(640x80) T(640x88) T(640x96) T(704x8) T(704x16) T(704x24) T(704x32) T(704x40)
  T(704x48) T(704x56) T(704x72) T(704x80) T(704x88) T(768x8) T(768x16) T(768x24) T(768x32)
  T(768x40) T(768x48) T(768x56) T(768x72) T(768x80) T(256x512) T(256x1024) T(512x512) T(512x1024)
};
#undef T
#define S(n) {int(CUBLASLT_MATMUL_STAGES_##n), #n},
static const EnumName kStageNames[] = {
  S(UNDEFINED) S(16x1) S(16x2) S(16x3) S(16x4) S(16x5) S(16x6) S(32x1) S(32x2) S(32x3) S(32x4)
  S(32x5) S(32x6) S(64x1) S(64x2) S(64x3) S(64x4) S(64x5) S(64x6) S(128x1) S(128x2) S(128x3)
  S(128x4) S(128x5) S(128x6) S(32x10) S(8x4) S(16x10) S(8x5) S(8x3) S(8xAUTO) S(16xAUTO) S(32xAUTO)
  S(64xAUTO) S(128xAUTO) S(256xAUTO) S(768xAUTO)
};
#undef S
#define C(n) {int(CUBLASLT_CLUSTER_SHAPE_##n), #n},
static const EnumName kClusterNames[] = {
  C(AUTO) C(1x1x1) C(2x1x1) C(4x1x1) C(1x2x1) C(2x2x1) C(4x2x1) C(1x4x1) C(2x4x1) C(4x4x1) C(8x1x1)
  C(1x8x1) C(8x2x1) C(2x8x1) C(16x1x1) C(1x16x1) C(3x1x1) C(5x1x1) C(6x1x1) C(7x1x1) C(9x1x1)
  C(10x1x1) C(11x1x1) C(12x1x1) C(13x1x1) C(14x1x1) C(15x1x1) C(3x2x1) C(5x2x1) C(6x2x1) C(7x2x1)
  C(1x3x1) C(2x3x1) C(3x3x1) C(4x3x1) C(5x3x1) C(3x4x1) C(1x5x1) C(2x5x1) C(3x5x1) C(1x6x1)
  C(2x6x1) C(1x7x1) C(2x7x1) C(1x9x1) C(1x10x1) C(1x11x1) C(1x12x1) C(1x13x1) C(1x14x1) C(1x15x1)
};
#undef C

template <size_t N>
static const char* enum_name(const EnumName (&tab)[N], long long v) {
  for (size_t i = 0; i < N; ++i)
    if (tab[i].value == v) return tab[i].name;
  return "?";
}

// Reads one algo-config attribute whatever its integer width (the header documents 16/32-bit types).
static bool algo_config_get(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                            long long& out) {
  size_t need = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS) return false;
  if (need == 0 || need > 8) return false;
  unsigned char buf[8] = {0};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, buf, need, &written) != CUBLAS_STATUS_SUCCESS) return false;
  switch (need) {
    case 1: { int8_t v; std::memcpy(&v, buf, 1); out = v; break; }
    case 2: { uint16_t v; std::memcpy(&v, buf, 2); out = v; break; }
    case 4: { int32_t v; std::memcpy(&v, buf, 4); out = v; break; }
    default: { int64_t v; std::memcpy(&v, buf, 8); out = v; break; }
  }
  return true;
}

static std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  long long v = 0;
  std::string s;
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t a, long long& x) { return algo_config_get(algo, a, x); };
  if (get(CUBLASLT_ALGO_CONFIG_ID, v)) s += fmt("algo_id=%lld", v);
  if (get(CUBLASLT_ALGO_CONFIG_TILE_ID, v)) s += fmt(" tile=%lld(%s)", v, enum_name(kTileNames, v));
  if (get(CUBLASLT_ALGO_CONFIG_STAGES_ID, v)) s += fmt(" stages=%lld(%s)", v, enum_name(kStageNames, v));
  if (get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, v)) s += fmt(" cluster=%lld(%s)", v, enum_name(kClusterNames, v));
  if (get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, v)) s += fmt(" splitk=%lld", v);
  if (get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, v)) s += fmt(" red=%lld", v);
  if (get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, v)) s += fmt(" swizzle=%lld", v);
  if (get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, v)) s += fmt(" custom=%lld", v);
  if (get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, v)) s += fmt(" inner=%lld", v);
  return s;
}

static std::string short_algo(const cublasLtMatmulAlgo_t& algo) {
  long long tile = 0, cl = 0, st = 0;
  std::string s = "cublasLt";
  if (algo_config_get(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, tile)) s += fmt(" %s", enum_name(kTileNames, tile));
  if (algo_config_get(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cl)) s += fmt(" c%s", enum_name(kClusterNames, cl));
  if (algo_config_get(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, st)) s += fmt(" st%s", enum_name(kStageNames, st));
  return s;
}

struct LtHandles {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtHandles() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// cuBLAS is column-major: X (row-major m×k) is a column-major k×m matrix with ld = k.
// D (m×m) = op(A)·op(B) with A = B = that k×m matrix, opA = T, opB = N  ("TN" in cuBLAS terms).
// D is symmetric, so its row/column-major interpretation does not matter.
static bool run_cublaslt_impl(cublasLtHandle_t lt, const Problem& p, const __half* X, __half* Dref, void* ws,
                              size_t ws_bytes, CheckStats* st, const Options& opt, Result& r,
                              std::string& config, bool& have_ref, std::string& err) {
  LtHandles h;
  LT_OK(cublasLtMatmulDescCreate(&h.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(h.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_OK(cublasLtMatmulDescSetAttribute(h.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LT_OK(cublasLtMatrixLayoutCreate(&h.a, CUDA_R_16F, p.k, p.m, p.k));
  LT_OK(cublasLtMatrixLayoutCreate(&h.b, CUDA_R_16F, p.k, p.m, p.k));
  LT_OK(cublasLtMatrixLayoutCreate(&h.c, CUDA_R_16F, p.m, p.m, p.m));
  if (p.l > 1) {
    int32_t bc = p.l;
    int64_t sab = int64_t(p.m) * p.k, sc = int64_t(p.m) * p.m;
    for (auto* lay : {&h.a, &h.b}) {
      LT_OK(cublasLtMatrixLayoutSetAttribute(*lay, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
      LT_OK(cublasLtMatrixLayoutSetAttribute(*lay, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sab, sizeof(sab)));
    }
    LT_OK(cublasLtMatrixLayoutSetAttribute(h.c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
    LT_OK(cublasLtMatrixLayoutSetAttribute(h.c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof(sc)));
  }
  LT_OK(cublasLtMatmulPreferenceCreate(&h.pref));
  uint64_t wsb = ws_bytes;
  LT_OK(cublasLtMatmulPreferenceSetAttribute(h.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));

  const int kReq = 8;
  cublasLtMatmulHeuristicResult_t heur[kReq];
  int nres = 0;
  LT_OK(cublasLtMatmulAlgoGetHeuristic(lt, h.op, h.a, h.b, h.c, h.c, h.pref, kReq, heur, &nres));
  if (nres <= 0) {
    err = "cublasLtMatmulAlgoGetHeuristic returned no algorithm";
    return false;
  }
  config = fmt("  %s  cuBLASLt heuristic: %d candidates\n", p.name().c_str(), nres);
  for (int i = 0; i < nres; ++i)
    config += fmt("    #%d %s%s ws=%zuB waves=%.2f\n", i, i == 0 ? "(used) " : "", describe_algo(heur[i].algo).c_str(),
                  heur[i].workspaceSize, double(heur[i].wavesCount));
  r.method = short_algo(heur[0].algo);

  const float alpha = 1.f, beta = 0.f;
  auto launch = [&](std::string& e) -> bool {
    cublasStatus_t s = cublasLtMatmul(lt, h.op, &alpha, X, h.a, X, h.b, &beta, Dref, h.c, Dref, h.c, &heur[0].algo,
                                      ws, ws_bytes, 0);
    if (s != CUBLAS_STATUS_SUCCESS) {
      e = fmt("cublasLtMatmul: status %d", int(s));
      return false;
    }
    return true;
  };
  // NOTE: the timed launches rewrite Dref with the same algorithm; it stays the reference.
  const bool ok = check_then_time(p, launch, X, Dref, nullptr, st, opt, r, err);
  have_ref = ok && r.check.rfind("ok", 0) == 0;
  return ok;
}

// ----------------------------------------------------------------------------------------------
// Driver
// ----------------------------------------------------------------------------------------------

static bool parse_problem(const char* s, int default_batch, Problem& p) {
  int m = 0, k = 0, l = 0;
  int n = std::sscanf(s, "%dx%dx%d", &m, &k, &l);
  if (n < 2 || m <= 0 || k <= 0) return false;
  p.m = m;
  p.k = k;
  p.l = (n == 3 && l > 0) ? l : default_batch;
  return true;
}

static void usage(const char* argv0) {
  std::printf("usage: %s [--iters N] [--warmup N] [--batch L] [MxK[xL] ...]\n"
              "default problems: 3584x18944 4096x14336 3584x3584 (batch 1)\n", argv0);
}

int main(int argc, char** argv) {
  Options opt;
  std::vector<const char*> prob_args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto need = [&](const char* what) -> int {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", what); std::exit(2); }
      return std::atoi(argv[++i]);
    };
    if (a == "--iters") opt.iters = std::max(1, need("--iters"));
    else if (a == "--warmup") opt.warmup = std::max(0, need("--warmup"));
    else if (a == "--batch") opt.batch = std::max(1, need("--batch"));
    else if (a == "-h" || a == "--help") { usage(argv[0]); return 0; }
    else prob_args.push_back(argv[i]);
  }
  if (prob_args.empty()) prob_args = {"3584x18944", "4096x14336", "3584x3584"};
  for (const char* s : prob_args) {
    Problem p;
    if (!parse_problem(s, opt.batch, p)) {
      std::fprintf(stderr, "bad problem '%s' (want MxK or MxKxL)\n", s);
      usage(argv[0]);
      return 2;
    }
    if (p.k % 8 != 0 || p.m % 8 != 0) {
      std::fprintf(stderr, "problem '%s': m and k must be multiples of 8 (16-byte TMA alignment)\n", s);
      return 2;
    }
    opt.problems.push_back(p);
  }

  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  int sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  std::printf("device: %s (sm_%d%d, %d SMs, %.0f MiB L2)  iters=%d warmup=%d  cuBLASLt %zu\n", prop.name, prop.major,
              prop.minor, sm_count, prop.l2CacheSize / 1048576.0, opt.iters, opt.warmup, cublasLtGetVersion());
  if (prop.major != 9) std::printf("warning: this binary only contains sm_90a code\n");

  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasLtCreate failed\n");
    lt = nullptr;
  }
  const size_t lt_ws_bytes = size_t(32) << 20;
  void* lt_ws = nullptr;
  CheckStats* st = nullptr;
  if (cudaMalloc(&lt_ws, lt_ws_bytes) != cudaSuccess || cudaMalloc(&st, sizeof(CheckStats)) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }

  std::vector<Result> results;
  std::string lt_configs;
  for (const Problem& p : opt.problems) {
    std::printf("== %s  (%.1f GFLOP)\n", p.name().c_str(), p.flops() / 1e9);
    std::fflush(stdout);
    __half *X = nullptr, *D = nullptr, *Dref = nullptr;
    size_t nx = size_t(p.l) * p.m * p.k, nd = size_t(p.l) * p.m * p.m;
    if (cudaMalloc(&X, nx * sizeof(__half)) != cudaSuccess || cudaMalloc(&D, nd * sizeof(__half)) != cudaSuccess ||
        cudaMalloc(&Dref, nd * sizeof(__half)) != cudaSuccess) {
      std::printf("  cudaMalloc failed for %s, skipping\n", p.name().c_str());
      cudaGetLastError();
      cudaFree(X); cudaFree(D); cudaFree(Dref);
      continue;
    }
    init_uniform<<<2048, 256>>>(X, nx, 1.0f / std::pow(float(p.k), 0.25f), 0x1234ULL);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("  init kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }

    // cuBLASLt first: its output is the full-matrix reference for the CUTLASS instances.
    bool have_ref = false;
    {
      Result r;
      r.problem = p.name();
      r.method = "cublasLt";
      std::string err, config;
      if (!lt) {
        r.note = "FAILED: no cuBLASLt handle";
      } else if (!run_cublaslt_impl(lt, p, X, Dref, lt_ws, lt_ws_bytes, st, opt, r, config, have_ref, err)) {
        r.ran = false;
        r.note = "FAILED: " + err;
        have_ref = false;
        cudaGetLastError();
      }
      lt_configs += config;
      std::printf("%s", config.c_str());
      results.push_back(r);
    }
    const __half* ref = have_ref ? Dref : nullptr;

    auto add = [&](Result r) {
      std::printf("  %-32s %s%s\n", r.method.c_str(), r.ran ? fmt("%8.3f ms %7.1f TF/s  %s  ", r.ms, r.tflops,
                                                                      r.check.c_str()).c_str() : "",
                  r.note.c_str());
      std::fflush(stdout);
      results.push_back(r);
    };
    add(Inst_128x128_c1_coop::run(p, X, D, ref, st, sm_count, opt, "cutlass 128x128x64 c1x1 coop"));
    add(Inst_128x128_c2_coop::run(p, X, D, ref, st, sm_count, opt, "cutlass 128x128x64 c2x1 coop"));
    add(Inst_128x256_c1_coop::run(p, X, D, ref, st, sm_count, opt, "cutlass 128x256x64 c1x1 coop"));
    add(Inst_128x256_c2_coop::run(p, X, D, ref, st, sm_count, opt, "cutlass 128x256x64 c2x1 coop"));
    add(Inst_256x128_c1_coop::run(p, X, D, ref, st, sm_count, opt, "cutlass 256x128x64 c1x1 coop"));
    add(Inst_128x128_c1_pp::run(p, X, D, ref, st, sm_count, opt, "cutlass 128x128x64 c1x1 pingpong"));

    cudaFree(X);
    cudaFree(D);
    cudaFree(Dref);
  }

  std::printf("\n==== summary (median of %d, TF/s = 2*m*m*k*batch/t) ====\n", opt.iters);
  for (const Result& r : results) {
    if (r.ran)
      std::printf("%-16s %-40s %8.3f ms %7.1f TF/s  %s\n", r.problem.c_str(), r.method.c_str(), r.ms, r.tflops,
                  r.check.c_str());
    else
      std::printf("%-16s %-40s %s\n", r.problem.c_str(), r.method.c_str(), r.note.c_str());
  }
  std::printf("\n==== cuBLASLt configs ====\n%s", lt_configs.c_str());

  cudaFree(lt_ws);
  cudaFree(st);
  if (lt) cublasLtDestroy(lt);
  return 0;
}
