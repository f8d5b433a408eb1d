// dmuon/step/cuda/sym_self_check.cpp — the kernel against the dense, mirrored cuBLASLt
// product on an odd-sized batch.
#include "step/cuda/sym_self_check.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "ns/cuda/autotune.h"
#include "ns/cuda/autotune_rules.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/elementwise.h"
#include "step/cpu/cpu_elements.h"

namespace dmuon::step::cuda {
namespace {

// 16-bit bit patterns of `values` in `dtype`.
std::vector<uint16_t> to_bits(const std::vector<float>& values, ns::cuda::DType dtype) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bits[i] = dtype == ns::cuda::DType::kFloat16 ? cpu::to_f16(values[i]).bits : cpu::to_bf16(values[i]).bits;
  return bits;
}

// Device memory freed when it goes out of scope (synchronous: the check is one-off).
struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t bytes) { DMUON_CHECK_CUDA(cudaMalloc(&ptr, bytes)); }
  ~DeviceBytes() { cudaFree(ptr); }
};

// Every element close (fp32 accumulation, one rounding each) and the result exactly symmetric.
bool self_check(ns::cuda::DType dtype) {
  constexpr int64_t kBatch = 3, kM = 203, kK = 333;
  const int64_t lda = ns::cuda::padded_ld(kK), ldd = ns::cuda::padded_ld(kM);
  // NOTE: a private generator with a fixed seed: the check is reproducible and touches no
  // caller's random stream.
  std::mt19937 rng(20261129);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> a(static_cast<size_t>(kBatch * kM * lda), 0.f), b = a;
  std::vector<float> c(static_cast<size_t>(kBatch * kM * ldd), 0.f);
  const float scale = 1.f / std::sqrt(static_cast<float>(kK));
  for (int64_t i = 0; i < kBatch * kM; ++i)
    for (int64_t k = 0; k < kK; ++k) {
      a[static_cast<size_t>(i * lda + k)] = normal(rng) * scale;
      b[static_cast<size_t>(i * lda + k)] = normal(rng) * scale;
    }
  for (int64_t n = 0; n < kBatch; ++n)
    for (int64_t i = 0; i < kM; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const float v = normal(rng);
        c[static_cast<size_t>((n * kM + i) * ldd + j)] = v;
        c[static_cast<size_t>((n * kM + j) * ldd + i)] = v;
      }
  const std::vector<uint16_t> ha = to_bits(a, dtype), hb = to_bits(b, dtype), hc = to_bits(c, dtype);
  DeviceBytes da(ha.size() * 2), db(hb.size() * 2), dc(hc.size() * 2), kernel(hc.size() * 2), dense(hc.size() * 2);
  DMUON_CHECK_CUDA(cudaMemcpy(da.ptr, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  DMUON_CHECK_CUDA(cudaMemcpy(db.ptr, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  DMUON_CHECK_CUDA(cudaMemcpy(dc.ptr, hc.data(), hc.size() * 2, cudaMemcpyHostToDevice));
  ns::cuda::SymProductArgs args;
  args.dtype = dtype;
  args.batch = kBatch, args.m = kM, args.k = kK;
  args.a = da.ptr, args.lda = lda, args.stride_a = kM * lda;
  args.b = db.ptr, args.ldb = lda, args.stride_b = kM * lda;
  args.c = dc.ptr, args.ldc = ldd, args.stride_c = kM * ldd;
  args.ldd = ldd, args.stride_d = kM * ldd;
  args.alpha = 0.75, args.beta = -0.5;
  cudaStream_t stream = nullptr;
  DMUON_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct DestroyStream {
    cudaStream_t s;
    ~DestroyStream() { cudaStreamDestroy(s); }
  } destroy{stream};
  args.d = kernel.ptr;
  ns::cuda::sym_product(args, ns::cuda::SymMode::kKernel, stream);
  args.d = dense.ptr;
  ns::cuda::sym_product(args, ns::cuda::SymMode::kDenseMirror, stream);
  const ns::cuda::CompareStats s =
      ns::cuda::compare_16bit(dtype, kernel.ptr, dense.ptr, kBatch, kM, kM, ldd, kM * ldd, true, stream);
  const double tol = (dtype == ns::cuda::DType::kFloat16 ? 4e-3 : 3e-2) * s.max_abs_ref;
  const bool ok = s.nonfinite == 0 && s.asymmetric == 0 && s.max_abs_diff <= tol;
  if (!ok)
    std::fprintf(stderr,
                 "dmuon: the sm_90a symmetric kernel failed its self-check (%s: max error %g vs tolerance %g, %u "
                 "non-finite, %u asymmetric); the step uses dense cuBLASLt products\n",
                 ns::cuda::dtype_name(dtype), static_cast<double>(s.max_abs_diff), tol, s.nonfinite, s.asymmetric);
  return ok;
}

}  // namespace

bool sym_kernel_usable(int device, ns::cuda::DType dtype) {
  if (!ns::cuda::sym_kernel_supported(device)) return false;
  static std::mutex mutex;
  static std::map<std::pair<int, int>, bool> verdicts;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, static_cast<int>(dtype));
  auto it = verdicts.find(key);
  if (it != verdicts.end()) return it->second;
  bool ok = false;
  int previous = 0;
  cudaGetDevice(&previous);
  try {
    DMUON_CHECK_CUDA(cudaSetDevice(device));
    ok = self_check(dtype);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dmuon: the sm_90a symmetric kernel's self-check raised: %s; the step uses dense products\n",
                 error.what());
  }
  cudaSetDevice(previous);
  verdicts[key] = ok;
  return ok;
}

ns::cuda::SymMode sym_mode_for(int device, ns::cuda::DType dtype, bool sym_kernel, const std::string& forced) {
  // NOTE: the kernel's self-check runs only where its verdict can matter.
  const bool ask_kernel = forced == "sm90" || (sym_kernel && (forced.empty() || forced == "auto"));
  const ns::cuda::SymMode mode =
      ns::cuda::choose_sym_mode(forced, ask_kernel && sym_kernel_usable(device, dtype), sym_kernel);
  static std::mutex mutex;
  static std::set<std::tuple<int, int, int>> logged;
  std::lock_guard<std::mutex> lock(mutex);
  if (logged.insert({device, static_cast<int>(dtype), static_cast<int>(mode)}).second) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) cudaGetLastError();
    std::fprintf(stderr, "dmuon: symmetric products (%s) on GPU %d, %s (sm_%d%d): %s\n",
                 ns::cuda::dtype_name(dtype), device, prop.name, prop.major, prop.minor,
                 ns::cuda::sym_mode_description(mode));
  }
  return mode;
}

}  // namespace dmuon::step::cuda
