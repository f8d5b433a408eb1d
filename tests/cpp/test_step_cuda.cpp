// The CUDA step ops against the CPU ops (each new piece kernel on random inputs, with the
// tolerance stated at each check), the NS of a batch against fp64, and the whole engine on
// one GPU (worlds 1 and 2, the second through the loopback transport with device copies)
// against the fp64 Muon. Every test skips where no CUDA device is visible.
#include <algorithm>
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ns/cpu/cpu_backend.h"
#include "ns/cuda/cuda_backend.h"
#include "ns/cuda/cuda_check.h"
#include "step/cpu/cpu_elements.h"
#include "step/cost_profile.h"
#include "step/cuda/cuda_ops.h"
#include "step/cuda/piece_kernels.h"
#include "optim/normuon.h"
#include "error_of.h"
#include "step_expect.h"
#include "step_world.h"

namespace {

using dmuon::step::Buffer;
using dmuon::step::CpuOps;
using dmuon::step::CudaOps;
using dmuon::step::DType;
using dmuon::testing::HostTensor;

#define SKIP_WITHOUT_GPU() \
  if (!dmuon::step::cuda_device_available()) GTEST_SKIP() << "no CUDA device"

const dmuon::step::Device kGpu{dmuon::step::DeviceKind::kCuda, 0};
const std::vector<DType> kFloatDtypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};

// Device memory holding a copy of a host tensor (or `bytes` of 0xff: NaN in every float type).
class DeviceCopy {
 public:
  explicit DeviceCopy(const HostTensor& host) : dtype_(host.dtype()), numel_(host.numel()) {
    DMUON_CHECK_CUDA(cudaMalloc(&ptr_, std::max<size_t>(1, host.bytes().size())));
    if (!host.bytes().empty())
      DMUON_CHECK_CUDA(cudaMemcpy(ptr_, host.data(), host.bytes().size(), cudaMemcpyHostToDevice));
  }
  DeviceCopy(DType dtype, int64_t numel) : dtype_(dtype), numel_(numel) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(1, numel * dmuon::step::dtype_size(dtype)));
    DMUON_CHECK_CUDA(cudaMalloc(&ptr_, bytes));
    DMUON_CHECK_CUDA(cudaMemset(ptr_, 0xff, bytes));
  }
  ~DeviceCopy() { cudaFree(ptr_); }
  DeviceCopy(const DeviceCopy&) = delete;
  Buffer view() const { return Buffer{numel_ == 0 ? nullptr : ptr_, dtype_, numel_, kGpu}; }
  Buffer view(int64_t offset, int64_t count) const { return view().slice(offset, count); }
  /// The device values, back into `host` (same dtype and size).
  void download(HostTensor& host) const {
    DMUON_CHECK_CUDA(cudaDeviceSynchronize());
    if (!host.bytes().empty())
      DMUON_CHECK_CUDA(cudaMemcpy(host.data(), ptr_, host.bytes().size(), cudaMemcpyDeviceToHost));
  }
  std::vector<double> values() const {
    HostTensor host(std::vector<double>(static_cast<size_t>(numel_), 0.0), dtype_);
    download(host);
    return host.values();
  }

 private:
  DType dtype_;
  int64_t numel_;
  void* ptr_ = nullptr;
};

std::vector<double> random_values(int64_t n, double scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = normal(rng);
  return v;
}

// The rounding unit of a dtype (half the distance between 1 and the next value).
double unit(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return std::ldexp(1.0, -8);
    case DType::kFloat16: return std::ldexp(1.0, -11);
    case DType::kFloat32: return std::ldexp(1.0, -24);
    default: return std::ldexp(1.0, -53);
  }
}

// The coarser of two dtypes (a value rounded to both is only as exact as this one).
DType coarser(DType a, DType b) { return unit(a) >= unit(b) ? a : b; }

// |a − b| within `ulps` units of `dtype` at the larger of their magnitude and the array's
// largest expected magnitude (plus its smallest subnormal); ulps = 0 demands equality.
// NOTE: the GPU contracts a·b + c into one FMA where the CPU rounds twice, and the lerp of
// the momentum and the apply p·decay + scale·O cancel, so an element much smaller than its
// operands can differ by a few of its own units (measured on an H200: 3e-10 on 6.9e-5 of an
// fp32 apply whose array reaches 0.05); one unit of the array's scale bounds that.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, DType dtype, double ulps,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tiny = dtype == DType::kFloat16 ? std::ldexp(1.0, -24) : 1e-37;
  double scale = 0.0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    const double magnitude = std::max({std::abs(got[i]), std::abs(want[i]), scale});
    const double bound = ulps * 2 * unit(dtype) * magnitude + ulps * tiny;
    if (!both_nan && !(std::abs(got[i] - want[i]) <= bound) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i] << " (bound " << bound << ")";
  }
}

dmuon::ns::Schedule gram_schedule() { return dmuon::testing::gram_rule(0.02, 0.0).schedule; }

// ---------------------------------------------------------------- check and prepare
TEST(StepCudaOps, CheckAndPrepareMatchTheCpuOps) {
  SKIP_WITHOUT_GPU();
  CpuOps cpu;
  CudaOps gpu;
  const std::vector<int64_t> sizes = {1000, 40000, 7};  // NOTE: 40000 spans three partial chunks
  for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType w : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const std::string what = std::string(dmuon::step::dtype_name(p)) + " → " + dmuon::step::dtype_name(w);
      std::vector<HostTensor> grad, momentum, wire;
      for (size_t k = 0; k < sizes.size(); ++k) {
        grad.emplace_back(random_values(sizes[k], 1.0, 10 + k), p);
        momentum.emplace_back(random_values(sizes[k], 0.3, 20 + k), p);
        wire.emplace_back(std::vector<double>(static_cast<size_t>(sizes[k]), 0.0), w);
      }
      // The flags: a NaN in piece 1's gradient, an Inf in piece 2's momentum.
      std::vector<HostTensor> bad_grad = grad, bad_momentum = momentum;
      bad_grad[1].set(12345, NAN);
      bad_momentum[2].set(3, INFINITY);
      std::vector<std::unique_ptr<DeviceCopy>> dg, dm, dw;
      std::vector<dmuon::step::CheckPiece> host_check, gpu_check;
      for (size_t k = 0; k < sizes.size(); ++k) {
        dg.push_back(std::make_unique<DeviceCopy>(bad_grad[k]));
        dm.push_back(std::make_unique<DeviceCopy>(bad_momentum[k]));
        host_check.push_back({bad_grad[k].buffer(), bad_momentum[k].buffer(), {0.95, true}, static_cast<int>(k), k == 0});
        gpu_check.push_back({dg[k]->view(), dm[k]->view(), {0.95, true}, static_cast<int>(k), k == 0});
      }
      std::vector<int32_t> host_flags(6, 0);
      cpu.check(host_check, {host_flags.data(), DType::kInt32, 6, {}});
      DeviceCopy gpu_flags(DType::kInt32, 6);
      gpu.fill_zero(gpu_flags.view());
      const auto partials = gpu.check(gpu_check, gpu_flags.view());
      EXPECT_EQ(gpu.read_flags({gpu_flags.view()}), host_flags) << what;
      EXPECT_EQ(host_flags, (std::vector<int32_t>{0, 0, 1, 0, 0, 1})) << what;
      ASSERT_EQ(partials.offset.size(), 1u);

      // Momentum and U into the wire, on finite data; piece 2 momentum only.
      dg.clear(), dm.clear();
      std::vector<dmuon::step::PreparePiece> host_prepare, gpu_prepare;
      for (size_t k = 0; k < sizes.size(); ++k) {
        dg.push_back(std::make_unique<DeviceCopy>(grad[k]));
        dm.push_back(std::make_unique<DeviceCopy>(momentum[k]));
        dw.push_back(std::make_unique<DeviceCopy>(w, sizes[k]));
        const bool to_wire = k != 2;
        host_prepare.push_back({grad[k].buffer(), momentum[k].buffer(), {0.9, k == 0}, to_wire ? wire[k].buffer() : Buffer{}});
        gpu_prepare.push_back({dg[k]->view(), dm[k]->view(), {0.9, k == 0}, to_wire ? dw[k]->view() : Buffer{}});
      }
      // A closed gate first: nothing may change.
      DeviceCopy gate(DType::kInt32, 1);
      gpu.prepare_pieces(gpu_prepare, gate.view());  // NOTE: 0xff bytes: non-zero, closed
      expect_close(dm[0]->values(), momentum[0].values(), p, 0, what + " momentum behind a closed gate");
      cpu.prepare_pieces(host_prepare, {});
      gpu.prepare_pieces(gpu_prepare, {});
      for (size_t k = 0; k < sizes.size(); ++k) {
        expect_close(dm[k]->values(), momentum[k].values(), p, 1, what + " momentum " + std::to_string(k));
        // NOTE: U is rounded to the parameter dtype before the wire: one unit of the coarser.
        if (k != 2) expect_close(dw[k]->values(), wire[k].values(), coarser(p, w), 1, what + " wire " + std::to_string(k));
      }
      dw.clear();
    }
  }
}

// ---------------------------------------------------------------- iterates
struct IterateCase {
  int64_t rows, cols;
};

// iterate[k] (device, m×ld 16-bit, transposed for tall) as item-ordered doubles, and
// whether its padding columns are zero.
std::vector<double> item_order(const std::vector<double>& iterate, int64_t k, int64_t rows, int64_t cols, int64_t ld,
                               bool* padding_zero) {
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  const bool transposed = rows > cols;
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(r * cols + c)] =
          iterate[static_cast<size_t>(k * m * ld + (transposed ? c * ld + r : r * ld + c))];
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = n; j < ld; ++j)
      if (iterate[static_cast<size_t>(k * m * ld + i * ld + j)] != 0.0) *padding_zero = false;
  return out;
}

std::vector<double> normalized(const std::vector<double>& u, double eps) {
  double sum = 0.0;
  for (double x : u) sum += x * x;
  const double scale = 1.0 / std::max(std::sqrt(sum), eps);
  std::vector<double> out(u.size());
  for (size_t i = 0; i < u.size(); ++i) out[i] = u[i] * scale;
  return out;
}

TEST(StepCudaOps, IterateFromPiecesNormalizesAndTransposes) {
  SKIP_WITHOUT_GPU();
  CudaOps gpu;
  const auto schedule = gram_schedule();
  for (const IterateCase& c : {IterateCase{70, 20}, IterateCase{20, 70}, IterateCase{33, 33}}) {
    for (DType w : {DType::kFloat32, DType::kBFloat16}) {
      for (DType it : {DType::kFloat16, DType::kBFloat16}) {
        const int64_t m = std::min(c.rows, c.cols), ld = dmuon::ns::cuda::padded_ld(std::max(c.rows, c.cols));
        const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " +
                                 dmuon::step::dtype_name(w) + " → " + dmuon::step::dtype_name(it);
        // Matrix 0 in three pieces (one of a single row), matrix 1 whole.
        const std::vector<std::pair<int64_t, int64_t>> rows0 = {{0, c.rows / 2}, {c.rows / 2, 1}, {c.rows / 2 + 1, c.rows - c.rows / 2 - 1}};
        std::vector<HostTensor> host;
        std::vector<std::unique_ptr<DeviceCopy>> device;
        std::vector<dmuon::step::WirePiece> pieces;
        std::vector<std::vector<double>> matrix(2);
        for (size_t k = 0; k < rows0.size() + 1; ++k) {
          const bool whole = k == rows0.size();
          const int64_t begin = whole ? 0 : rows0[k].first, count = whole ? c.rows : rows0[k].second;
          host.emplace_back(random_values(count * c.cols, 2.0, 30 + k), w);
          device.push_back(std::make_unique<DeviceCopy>(host.back()));
          pieces.push_back({device.back()->view(), whole ? 1 : 0, begin, count});
          const auto v = host.back().values();
          matrix[whole ? 1 : 0].insert(matrix[whole ? 1 : 0].end(), v.begin(), v.end());
        }
        DeviceCopy iterate(it, 2 * m * ld);
        const dmuon::step::NsBatchDesc desc{c.rows, c.cols, 2, DType::kFloat32, &schedule, true};
        gpu.iterate_from_pieces(pieces, desc, {iterate.view().data, it, ld, m * ld, c.rows > c.cols}, {});
        const auto values = iterate.values();
        for (int64_t k = 0; k < 2; ++k) {
          bool padding_zero = true;
          // NOTE: 2 units: the fp32 norm (vs fp64 here) and the final rounding.
          expect_close(item_order(values, k, c.rows, c.cols, ld, &padding_zero),
                       dmuon::testing::rounded(normalized(matrix[static_cast<size_t>(k)], schedule.eps), it), it, 2,
                       what + " matrix " + std::to_string(k));
          EXPECT_TRUE(padding_zero) << what;
        }
      }
    }
  }
}

TEST(StepCudaOps, PrepareToIterateFromCheckPartials) {
  SKIP_WITHOUT_GPU();
  CpuOps cpu;
  CudaOps gpu;
  const auto schedule = gram_schedule();
  for (const IterateCase& c : {IterateCase{48, 16}, IterateCase{16, 48}}) {
    for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (bool in_order : {true, false}) {
        const int64_t m = std::min(c.rows, c.cols), ld = dmuon::ns::cuda::padded_ld(std::max(c.rows, c.cols));
        const int64_t numel = c.rows * c.cols;
        const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " +
                                 dmuon::step::dtype_name(p) + (in_order ? " in order" : " out of order");
        std::vector<HostTensor> grad, momentum, u;
        std::vector<std::unique_ptr<DeviceCopy>> dg, dm;
        std::vector<dmuon::step::CheckPiece> check;
        for (int k = 0; k < 2; ++k) {
          grad.emplace_back(random_values(numel, 1.0, 40 + k), p);
          momentum.emplace_back(random_values(numel, 0.2, 50 + k), p);
          u.emplace_back(std::vector<double>(static_cast<size_t>(numel), 0.0), DType::kFloat32);
          dg.push_back(std::make_unique<DeviceCopy>(grad.back()));
          dm.push_back(std::make_unique<DeviceCopy>(momentum.back()));
          check.push_back({dg.back()->view(), dm.back()->view(), {0.95, true}, k, true});
        }
        DeviceCopy flags(DType::kInt32, 4);
        gpu.fill_zero(flags.view());
        const auto partials = gpu.check(check, flags.view());
        // The CPU's U (float32 holds every 16-bit value exactly) and new momentum.
        std::vector<dmuon::step::PreparePiece> host;
        for (int k = 0; k < 2; ++k) host.push_back({grad[k].buffer(), momentum[k].buffer(), {0.95, true}, u[k].buffer()});
        cpu.prepare_pieces(host, {});
        // In order: both matrices at their positions (float32: the vectorized pass); out of
        // order: matrix 1 first, then matrix 0 alone (the generic pass).
        DeviceCopy iterate(DType::kFloat16, 2 * m * ld);
        const dmuon::step::NsView view{iterate.view().data, DType::kFloat16, ld, m * ld, c.rows > c.cols};
        const dmuon::step::NsBatchDesc desc{c.rows, c.cols, 2, p, &schedule, true};
        std::vector<dmuon::step::LocalMatrix> all;
        for (int k = 0; k < 2; ++k) all.push_back({dg[k]->view(), dm[k]->view(), {0.95, true}, k, k});
        if (in_order) {
          gpu.prepare_to_iterate(all, partials, desc, view, true, {});
        } else {
          gpu.prepare_to_iterate({all[1]}, partials, desc, view, true, {});
          gpu.prepare_to_iterate({all[0]}, partials, desc, view, true, {});
        }
        const auto values = iterate.values();
        for (int k = 0; k < 2; ++k) {
          bool padding_zero = true;
          // NOTE: U may differ from the CPU's by one unit of the parameter dtype (FMA), then
          // the normalized value by one unit of float16 in its rounding.
          expect_close(item_order(values, k, c.rows, c.cols, ld, &padding_zero),
                       dmuon::testing::rounded(normalized(u[k].values(), schedule.eps), DType::kFloat16),
                       coarser(p, DType::kFloat16), 2, what + " iterate " + std::to_string(k));
          EXPECT_TRUE(padding_zero) << what;
          expect_close(dm[k]->values(), momentum[k].values(), p, 1, what + " momentum " + std::to_string(k));
        }
        // Read again without updating (the autotuner's second preparation): the same iterate.
        // NOTE: within a unit: out of order, float32 went through the generic pass first and
        // the vectorized one now (the same arithmetic; a compiler may contract it otherwise).
        gpu.prepare_to_iterate(all, partials, desc, view, false, {});
        expect_close(iterate.values(), values, DType::kFloat16, in_order ? 0 : 1, what + " second preparation");
      }
    }
  }
}

// ---------------------------------------------------------------- results and apply
TEST(StepCudaOps, ResultToPiecesAndApplyMatchTheCpuOps) {
  SKIP_WITHOUT_GPU();
  CpuOps cpu;
  CudaOps gpu;
  const auto schedule = gram_schedule();
  for (const IterateCase& c : {IterateCase{40, 24}, IterateCase{24, 40}}) {
    const int64_t m = std::min(c.rows, c.cols), ld = dmuon::ns::cuda::padded_ld(std::max(c.rows, c.cols));
    const int64_t numel = c.rows * c.cols;
    const bool transposed = c.rows > c.cols;
    // A float16 result in the iterate layout (garbage in the padding), and the same values
    // item-ordered in float32 for the CPU ops; one NaN in matrix 1.
    std::vector<double> item(static_cast<size_t>(2 * numel)), layout(static_cast<size_t>(2 * m * ld), 7.0);
    const auto random = dmuon::testing::rounded(random_values(2 * numel, 0.3, 60), DType::kFloat16);
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t col = 0; col < c.cols; ++col) {
          const double v = k == 1 && r == 2 && col == 3 ? NAN : random[static_cast<size_t>(k * numel + r * c.cols + col)];
          item[static_cast<size_t>(k * numel + r * c.cols + col)] = v;
          layout[static_cast<size_t>(k * m * ld + (transposed ? col * ld + r : r * ld + col))] = v;
        }
    const HostTensor item_f32(item, DType::kFloat32);
    const DeviceCopy result(HostTensor(layout, DType::kFloat16));
    const dmuon::step::NsView gpu_view{result.view().data, DType::kFloat16, ld, m * ld, transposed};
    const dmuon::step::NsView cpu_view{item_f32.data(), DType::kFloat32, c.cols, numel, false};
    const dmuon::step::NsBatchDesc desc{c.rows, c.cols, 2, DType::kFloat32, &schedule, true};

    // Rows [5, 17) of matrix 0 and all of matrix 1 into wires: exact conversions.
    for (DType w : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      HostTensor host0(std::vector<double>(12 * static_cast<size_t>(c.cols), 0.0), w),
          host1(std::vector<double>(static_cast<size_t>(numel), 0.0), w);
      DeviceCopy dev0(w, 12 * c.cols), dev1(w, numel);
      cpu.result_to_pieces(cpu_view, desc, {{host0.buffer(), 0, 5, 12}, {host1.buffer(), 1, 0, c.rows}});
      gpu.result_to_pieces(gpu_view, desc, {{dev0.view(), 0, 5, 12}, {dev1.view(), 1, 0, c.rows}});
      expect_close(dev0.values(), host0.values(), w, 0, "result rows 5..17 into " + std::string(dmuon::step::dtype_name(w)));
      expect_close(dev1.values(), host1.values(), w, 0, "result matrix 1 into " + std::string(dmuon::step::dtype_name(w)));
    }

    // Apply: rows [5, 17) of matrix 0 (flag 0; also rounded through a bfloat16 wire) and
    // matrix 1 (flag 1, holds the NaN) onto parameters of each dtype.
    for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (bool through_wire : {false, true}) {
        const std::string what = std::string(dmuon::step::dtype_name(p)) + (through_wire ? " through the wire" : "");
        HostTensor p0(random_values(12 * c.cols, 1.0, 70), p), p1(random_values(numel, 1.0, 71), p);
        DeviceCopy d0(p0), d1(p1);
        auto pieces = [&](const Buffer& a, const Buffer& b) {
          dmuon::step::ApplyPiece first{a, {}, 0, 5, 12, -0.1, 0.99, 0};
          first.round_through_wire = through_wire;
          first.wire_dtype = DType::kBFloat16;
          return std::vector<dmuon::step::ApplyPiece>{first, {b, {}, 1, 0, c.rows, -0.05, 1.0, 1}};
        };
        std::vector<int32_t> host_flags(2, 0);
        DeviceCopy flags(DType::kInt32, 2);
        gpu.fill_zero(flags.view());
        cpu.apply_result(cpu_view, desc, pieces(p0.buffer(), p1.buffer()), {}, {host_flags.data(), DType::kInt32, 2, {}});
        gpu.apply_result(gpu_view, desc, pieces(d0.view(), d1.view()), {}, flags.view());
        expect_close(d0.values(), p0.values(), p, 1, what + " matrix 0");
        expect_close(d1.values(), p1.values(), p, 1, what + " matrix 1");
        EXPECT_EQ(gpu.read_flags({flags.view()}), host_flags) << what;
        EXPECT_EQ(host_flags, (std::vector<int32_t>{0, 1})) << what;
      }
    }
  }
}

// Which pieces the vector kernels take (host only: no GPU needed). The bit-for-bit test
// below relies on the aligned twin taking them and the other not.
TEST(StepCudaOps, ApplyResultVectorizesAlignedPiecesOnly) {
  namespace sc = dmuon::step::cuda;
  alignas(64) static char memory[4096];
  sc::IterateView rows_result{memory, DType::kBFloat16, 72, 200, 200, 72 * 200};
  sc::IterateView transposed = rows_result;
  transposed.rows = 200, transposed.cols = 72;
  sc::ApplyDesc whole{memory + 256, nullptr, 0, 0, 24, -0.1f, 1.f, 0, 8, 40};
  for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const std::string what = dmuon::step::dtype_name(p);
    EXPECT_TRUE(sc::apply_result_vectorizes(rows_result, &whole, 1, p)) << what;
    EXPECT_TRUE(sc::apply_result_vectorizes(transposed, &whole, 1, p)) << what;
    sc::ApplyDesc off = whole;  // one element off the alignment of a run of 4
    off.param = memory + 256 + dmuon::step::dtype_size(p);
    EXPECT_FALSE(sc::apply_result_vectorizes(rows_result, &off, 1, p)) << what;
    const sc::ApplyDesc two[2] = {whole, off};  // one piece decides for the launch
    EXPECT_FALSE(sc::apply_result_vectorizes(transposed, two, 2, p)) << what;
    off = whole, off.col_count = 42, off.ld = 44;  // rows of 42 elements, 44 apart
    EXPECT_FALSE(sc::apply_result_vectorizes(rows_result, &off, 1, p)) << what;
    off = whole, off.ld = 42;  // rows of 40, 42 apart
    EXPECT_FALSE(sc::apply_result_vectorizes(rows_result, &off, 1, p)) << what;
    off = whole, off.col_begin = 6;
    EXPECT_FALSE(sc::apply_result_vectorizes(rows_result, &off, 1, p)) << what;
    EXPECT_TRUE(sc::apply_result_vectorizes(transposed, &off, 1, p)) << what << ": a transposed result reads columns";
    off = whole, off.row_begin = 4;
    EXPECT_TRUE(sc::apply_result_vectorizes(rows_result, &off, 1, p)) << what;
    EXPECT_FALSE(sc::apply_result_vectorizes(transposed, &off, 1, p)) << what << ": runs of 8 along a transposed row";
    sc::IterateView narrow = rows_result;
    narrow.ld = 204, narrow.stride = 72 * 204;
    EXPECT_FALSE(sc::apply_result_vectorizes(narrow, &whole, 1, p)) << what;
    narrow = rows_result, narrow.data = memory + 8;
    EXPECT_FALSE(sc::apply_result_vectorizes(narrow, &whole, 1, p)) << what;
  }
}

// apply_result's vector kernels (aligned parameters) against its scalar tiles (the same
// parameters one element off alignment): the same bits and flags, for a row-major and a
// transposed result, partial tiles, a column block of rows from an aligned row, row factors
// on one matrix, decay and the rounding through a wire.
TEST(StepCudaOps, ApplyResultVectorKernelsMatchTheScalarTilesBitForBit) {
  SKIP_WITHOUT_GPU();
  CudaOps gpu;
  const auto schedule = gram_schedule();
  for (const IterateCase& c : {IterateCase{200, 72}, IterateCase{72, 200}, IterateCase{48, 48}}) {
    const int64_t m = std::min(c.rows, c.cols), ld = dmuon::ns::cuda::padded_ld(std::max(c.rows, c.cols));
    const int64_t block_rows = 24, block_cols = 40;  // matrix 1's piece: rows [8, 32), columns [8, 48)
    const dmuon::step::NsBatchDesc desc{c.rows, c.cols, 2, DType::kFloat32, &schedule, true};
    DeviceCopy row_scale(HostTensor(random_values(2 * c.rows, 0.5, 81), DType::kFloat32));
    DeviceCopy row_scaled(DType::kInt32, 2);
    const int32_t scaled_host[2] = {1, 0};
    DMUON_CHECK_CUDA(cudaMemcpy(row_scaled.view().data, scaled_host, sizeof(scaled_host), cudaMemcpyHostToDevice));
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<double> layout = random_values(2 * m * ld, 0.3, 80);
      layout[3] = NAN;  // an element of matrix 0
      const DeviceCopy result(HostTensor(layout, t));
      for (bool factors : {false, true}) {
        dmuon::step::NsView view{result.view().data, t, ld, m * ld, c.rows > c.cols};
        if (factors) {
          view.row_scale = static_cast<const float*>(row_scale.view().data);
          view.row_scaled = static_cast<const int*>(row_scaled.view().data);
        }
        for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          for (bool through_wire : {false, true}) {
            const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " +
                                     dmuon::step::dtype_name(t) + " result onto " + dmuon::step::dtype_name(p) +
                                     (factors ? ", row factors" : "") + (through_wire ? ", through the wire" : "");
            const HostTensor host0(random_values(c.rows * c.cols, 1.0, 82), p);
            const HostTensor host1(random_values(block_rows * block_cols, 1.0, 83), p);
            // The same parameters twice: at the start of an allocation, and one element in.
            std::vector<std::unique_ptr<DeviceCopy>> params;
            std::vector<Buffer> views;
            for (const HostTensor* host : {&host0, &host1, &host0, &host1}) {
              const int64_t offset = params.size() < 2 ? 0 : 1;
              params.push_back(std::make_unique<DeviceCopy>(p, host->numel() + offset));
              views.push_back(params.back()->view(offset, host->numel()));
              DMUON_CHECK_CUDA(cudaMemcpy(views.back().data, host->data(), host->bytes().size(), cudaMemcpyHostToDevice));
            }
            std::vector<std::vector<int32_t>> raised;
            for (int twin = 0; twin < 2; ++twin) {
              dmuon::step::ApplyPiece whole{views[2 * twin], {}, 0, 0, c.rows, -0.1, 0.99, 0};
              whole.round_through_wire = through_wire;
              whole.wire_dtype = DType::kBFloat16;
              dmuon::step::ApplyPiece block{views[2 * twin + 1], {}, 1, 8, block_rows, -0.05, 1.0, 1};
              block.col_begin = 8;
              block.col_count = block_cols;
              DeviceCopy flags(DType::kInt32, 2);
              gpu.fill_zero(flags.view());
              gpu.apply_result(view, desc, {whole, block}, {}, flags.view());
              raised.push_back(gpu.read_flags({flags.view()}));
            }
            auto values = [](const Buffer& b) {
              HostTensor host(std::vector<double>(static_cast<size_t>(b.numel), 0.0), b.dtype);
              DMUON_CHECK_CUDA(cudaMemcpy(host.data(), b.data, host.bytes().size(), cudaMemcpyDeviceToHost));
              return host.values();
            };
            expect_close(values(views[2]), values(views[0]), p, 0, what + ", matrix 0");
            expect_close(values(views[3]), values(views[1]), p, 0, what + ", matrix 1's block");
            EXPECT_EQ(raised[0], (std::vector<int32_t>{1, 0})) << what;
            EXPECT_EQ(raised[1], raised[0]) << what;
          }
        }
      }
    }
  }
}

TEST(StepCudaOps, ApplyPiecesMatchTheCpuOpsAndHonourTheGate) {
  SKIP_WITHOUT_GPU();
  CpuOps cpu;
  CudaOps gpu;
  for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType w : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const std::string what = std::string(dmuon::step::dtype_name(w)) + " onto " + dmuon::step::dtype_name(p);
      HostTensor wire0(random_values(5000, 0.3, 80), w), wire1(random_values(33, 0.3, 81), w);
      wire1.set(7, INFINITY);
      HostTensor p0(random_values(5000, 1.0, 82), p), p1(random_values(33, 1.0, 83), p);
      const HostTensor p0_before = p0;
      DeviceCopy dw0(wire0), dw1(wire1), dp0(p0), dp1(p1);
      auto pieces = [](const Buffer& param0, const Buffer& w0, const Buffer& param1, const Buffer& w1) {
        return std::vector<dmuon::step::ApplyPiece>{{param0, w0, 0, 0, 0, -0.02, 0.999, 0},
                                                    {param1, w1, 0, 0, 0, -0.3, 1.0, 1}};
      };
      DeviceCopy closed(DType::kInt32, 1), flags(DType::kInt32, 2);
      gpu.fill_zero(flags.view());
      gpu.apply_pieces(pieces(dp0.view(), dw0.view(), dp1.view(), dw1.view()), closed.view(), flags.view());
      expect_close(dp0.values(), p0_before.values(), p, 0, what + " behind a closed gate");
      std::vector<int32_t> host_flags(2, 0);
      cpu.apply_pieces(pieces(p0.buffer(), wire0.buffer(), p1.buffer(), wire1.buffer()), {},
                       {host_flags.data(), DType::kInt32, 2, {}});
      gpu.apply_pieces(pieces(dp0.view(), dw0.view(), dp1.view(), dw1.view()), {}, flags.view());
      expect_close(dp0.values(), p0.values(), p, 1, what + " piece 0");
      expect_close(dp1.values(), p1.values(), p, 1, what + " piece 1");
      EXPECT_EQ(gpu.read_flags({flags.view()}), host_flags) << what;
      EXPECT_EQ(host_flags, (std::vector<int32_t>{0, 1})) << what;
    }
  }
}

// sum_into (the weight-ownership mode's gradients into their buckets, a bucket's pieces
// reduced on their owner): every source × destination dtype, three parts 4099 elements
// apart, scaled and added to what the destination holds, against the CPU ops (which sum in
// double): within 2 units of the destination's dtype at the array's scale (float sums of
// three terms, one rounding each).
TEST(StepCudaOps, SumIntoMatchesTheCpuOps) {
  SKIP_WITHOUT_GPU();
  CpuOps cpu;
  CudaOps gpu;
  for (DType s : kFloatDtypes)
    for (DType d : kFloatDtypes) {
      const std::string what = std::string(dmuon::step::dtype_name(s)) + " into " + dmuon::step::dtype_name(d);
      const HostTensor src(random_values(3 * 4099, 1.0, 90), s);
      HostTensor dst(random_values(4000, 1.0, 91), d);
      const DeviceCopy dsrc(src), ddst(dst);
      gpu.sum_into(dsrc.view(), 3, 4099, ddst.view(), 1.0 / 3, true);
      cpu.sum_into(src.buffer(), 3, 4099, dst.buffer(), 1.0 / 3, true);
      expect_close(ddst.values(), dst.values(), d, 2, what);
    }
}

// copy (staged momentum, the send buffer's further copies, NorMuon's rows): one list of 40
// pairs (two launches), every float dtype, contiguous and strided on either side (strides
// unlike each other), aligned and at an odd element offset (16-byte units and element
// units), against the CPU ops: bit for bit, and nothing outside the destination views written.
TEST(StepCudaOps, CopyMatchesTheCpuOpsBitForBit) {
  SKIP_WITHOUT_GPU();
  CpuOps cpu;
  CudaOps gpu;
  constexpr int kPairs = 40;
  constexpr int64_t kRowLen = 33, kSrcLd = 41, kDstLd = 37;
  std::vector<HostTensor> src(kPairs), dst(kPairs);
  std::vector<std::unique_ptr<DeviceCopy>> dsrc, ddst;
  std::vector<dmuon::step::CopyPiece> on_gpu, on_cpu;
  for (int k = 0; k < kPairs; ++k) {
    const DType dtype = kFloatDtypes[static_cast<size_t>(k) % kFloatDtypes.size()];
    const int layout = (k / 4) % 5;  // 0 aligned, 1 odd offset, 2 strided source, 3 strided destination, 4 both
    const int64_t rows = 7 + k, offset = layout == 1 ? 1 : 0, total = rows * kSrcLd + 1;
    src[k] = HostTensor(random_values(total, 1.0, 200 + k), dtype);
    dst[k] = HostTensor(random_values(total, 1.0, 300 + k), dtype);
    dsrc.push_back(std::make_unique<DeviceCopy>(src[k]));
    ddst.push_back(std::make_unique<DeviceCopy>(dst[k]));
    const auto view = [&](const Buffer& whole, bool strided, int64_t ld) {
      return strided ? whole.rows(offset, rows, kRowLen, ld) : whole.slice(offset, rows * kRowLen);
    };
    const bool src_strided = layout == 2 || layout == 4, dst_strided = layout == 3 || layout == 4;
    on_gpu.push_back({view(dsrc.back()->view(), src_strided, kSrcLd), view(ddst.back()->view(), dst_strided, kDstLd)});
    on_cpu.push_back({view(src[k].buffer(), src_strided, kSrcLd), view(dst[k].buffer(), dst_strided, kDstLd)});
  }
  gpu.copy(on_gpu);
  cpu.copy(on_cpu);
  for (int k = 0; k < kPairs; ++k)
    expect_close(ddst[static_cast<size_t>(k)]->values(), dst[static_cast<size_t>(k)].values(), dst[k].dtype(), 0,
                 "copy pair " + std::to_string(k));
}

// fingerprint (the step begun from backward's comparison): 40 pieces (two launches), every
// element width, contiguous and strided, one piece of several blocks' elements, split over
// two calls: the same uint64 sum as the CPU ops, bit for bit (an integer sum: no tolerance);
// one element changed on the device changes it.
TEST(StepCudaOps, FingerprintMatchesTheCpuOpsBitForBit) {
  SKIP_WITHOUT_GPU();
  CpuOps cpu;
  CudaOps gpu;
  constexpr int kPieces = 40;
  constexpr int64_t kRowLen = 33, kLd = 41;
  std::vector<HostTensor> host(kPieces);
  std::vector<std::unique_ptr<DeviceCopy>> device;
  std::vector<dmuon::step::FingerprintPiece> on_gpu, on_cpu;
  for (int k = 0; k < kPieces; ++k) {
    const DType dtype = kFloatDtypes[static_cast<size_t>(k) % kFloatDtypes.size()];
    const int64_t rows = k == 7 ? 3000 : 5 + k, total = rows * kLd;
    host[k] = HostTensor(random_values(total, 1.0, 400 + k), dtype);
    device.push_back(std::make_unique<DeviceCopy>(host[k]));
    const bool strided = k % 3 == 1;
    const auto view = [&](const Buffer& whole) {
      return strided ? whole.rows(0, rows, kRowLen, kLd) : whole.slice(0, total);
    };
    on_gpu.push_back({view(device.back()->view()), static_cast<uint64_t>(k)});
    on_cpu.push_back({view(host[k].buffer()), static_cast<uint64_t>(k)});
  }
  const auto read = [](const std::vector<int32_t>& words) {
    uint64_t out;
    std::memcpy(&out, words.data(), sizeof(out));
    return out;
  };
  std::vector<int32_t> cpu_sum(2, 0);
  cpu.fingerprint(on_cpu, {cpu_sum.data(), DType::kInt32, 2, {}});
  dmuon::step::OwnedBuffer gpu_sum = gpu.allocate(DType::kInt32, 2);
  gpu.fill_zero(gpu_sum.get());
  gpu.fingerprint({on_gpu.begin(), on_gpu.begin() + 13}, gpu_sum.get());
  gpu.fingerprint({on_gpu.begin() + 13, on_gpu.end()}, gpu_sum.get());
  EXPECT_EQ(read(gpu.read_flags({gpu_sum.get()})), read(cpu_sum));
  EXPECT_NE(read(cpu_sum), 0u);
  // One element of the large (strided) piece changed on the device: its last, in the last block.
  host[7].set((3000 - 1) * kLd + kRowLen - 1, 0.25);
  DeviceCopy changed(host[7]);
  on_gpu[7].data = changed.view().rows(0, 3000, kRowLen, kLd);
  gpu.fill_zero(gpu_sum.get());
  gpu.fingerprint(on_gpu, gpu_sum.get());
  EXPECT_NE(read(gpu.read_flags({gpu_sum.get()})), read(cpu_sum));
}

// ---------------------------------------------------------------- NorMuon
// The CUDA NorMuon pass on a 16-bit result in the iterate layout (padded or odd ld, both
// orientations), read back through result_to_pieces into float32 wires, against
// optim::normuon_matrix in double on the same rounded values: the rows within 2e-5 of the
// array's scale and v within 2e-5 relative (row sums in float of 16-bit values). The result
// memory itself stays untouched (its consumers apply the row factors). Matrix 2 is not
// listed and reads as it was; matrix 3 holds a NaN: it and its v stay, and its flag is
// raised; a closed gate changes nothing.
TEST(StepCudaOps, NormuonMatchesTheCpuRule) {
  SKIP_WITHOUT_GPU();
  CudaOps gpu;
  const auto schedule = gram_schedule();
  const dmuon::optim::NormuonRule rule{true, 0.9, 1e-8};
  const double close = 2e-5 / (2 * unit(DType::kFloat32));  // NOTE: in units of float32 (expect_close)
  struct Case {
    int64_t rows, cols, ld;  // ld 0: the NS iterate's padded ld
  };
  for (const Case& c : {Case{40, 72, 0}, Case{72, 40, 0}, Case{37, 101, 101}, Case{101, 37, 103}, Case{9, 9, 0}}) {
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      const int64_t m = std::min(c.rows, c.cols), n = std::max(c.rows, c.cols);
      const int64_t ld = c.ld > 0 ? c.ld : dmuon::ns::cuda::padded_ld(n), numel = c.rows * c.cols;
      const bool transposed = c.rows > c.cols;
      const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " ld " + std::to_string(ld) +
                               " " + dmuon::step::dtype_name(t);
      const auto item = dmuon::testing::rounded(random_values(4 * numel, 0.05, 90), t);
      std::vector<double> layout(static_cast<size_t>(4 * m * ld), 0.5);
      auto at = [&](int64_t k, int64_t r, int64_t col) {
        return static_cast<size_t>(k * m * ld + (transposed ? col * ld + r : r * ld + col));
      };
      for (int64_t k = 0; k < 4; ++k)
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t col = 0; col < c.cols; ++col)
            layout[at(k, r, col)] = item[static_cast<size_t>(k * numel + r * c.cols + col)];
      layout[at(3, c.rows / 2, 1)] = NAN;
      const std::vector<double> layout_t = HostTensor(layout, t).values();
      const std::vector<double> v0 = random_values(c.rows, 1.0, 91);
      std::vector<double> v_start(v0.size());
      for (size_t i = 0; i < v0.size(); ++i) v_start[i] = 1e-4 * v0[i] * v0[i];
      const HostTensor v_host(v_start, DType::kFloat32);
      const std::vector<double> v_values = v_host.values();
      const dmuon::step::NsBatchDesc desc{c.rows, c.cols, 4, DType::kFloat32, &schedule, true};

      for (bool closed : {true, false}) {
        const DeviceCopy result(HostTensor(layout, t));
        const DeviceCopy v0_dev(v_host), v1_dev(v_host), v3_dev(v_host);
        DeviceCopy flags(DType::kInt32, 4), gate(DType::kInt32, 1);
        gpu.fill_zero(flags.view());
        if (!closed) gpu.fill_zero(gate.view());
        dmuon::step::NsView view{result.view().data, t, ld, m * ld, transposed};
        const dmuon::step::OwnedBuffer factors = gpu.normuon(
            view, desc, {{v0_dev.view(), 0, 0}, {v1_dev.view(), 1, 1}, {v3_dev.view(), 3, 3}}, rule, gate.view(),
            flags.view());
        // Every matrix read back as its consumers read it.
        std::vector<std::unique_ptr<DeviceCopy>> wires;
        std::vector<dmuon::step::WirePiece> pieces;
        for (int64_t k = 0; k < 4; ++k) {
          wires.push_back(std::make_unique<DeviceCopy>(DType::kFloat32, numel));
          pieces.push_back({wires.back()->view(), k, 0, c.rows});
        }
        gpu.result_to_pieces(view, desc, pieces);
        expect_close(result.values(), layout_t, t, 0, what + ": the result memory is not written");
        const std::vector<int32_t> raised = gpu.read_flags({flags.view()});
        EXPECT_EQ(raised, (std::vector<int32_t>{0, 0, 0, closed ? 0 : 1})) << what;
        for (int64_t k = 0; k < 4; ++k) {
          std::vector<double> want(static_cast<size_t>(numel));
          for (int64_t r = 0; r < c.rows; ++r)
            for (int64_t col = 0; col < c.cols; ++col) want[static_cast<size_t>(r * c.cols + col)] = layout_t[at(k, r, col)];
          std::vector<float> v(v_values.begin(), v_values.end());
          const bool normalized = !closed && k <= 1;
          if (normalized)
            ASSERT_TRUE(dmuon::optim::normuon_matrix<double>(want.data(), {c.rows, c.cols, c.cols, false}, v.data(), rule));
          expect_close(wires[static_cast<size_t>(k)]->values(), want, DType::kFloat32, normalized ? close : 0,
                       what + (closed ? " behind a closed gate" : "") + ", matrix " + std::to_string(k));
          if (k == 2) continue;
          const DeviceCopy& v_dev = k == 0 ? v0_dev : k == 1 ? v1_dev : v3_dev;
          expect_close(v_dev.values(), std::vector<double>(v.begin(), v.end()), DType::kFloat32,
                       normalized ? close : 0, what + " v of matrix " + std::to_string(k));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- NS of a batch
// The whole batch through orthogonalize (pieces in, wire out), eager, captured and
// replayed, against the same schedule in fp64.
TEST(StepCudaOps, OrthogonalizeMatchesFp64AndReplaysItsGraph) {
  SKIP_WITHOUT_GPU();
  CudaOps gpu;
  struct Case {
    bool gram;
    int64_t rows, cols;
  };
  for (const Case& c : {Case{true, 64, 200}, Case{true, 200, 64}, Case{true, 96, 96}, Case{false, 64, 200},
                        Case{false, 120, 48}}) {
    const auto rule = c.gram ? dmuon::testing::gram_rule(0.02, 0.0) : dmuon::testing::standard_rule(0.02, 0.0);
    const int64_t count = 3, numel = c.rows * c.cols;
    const std::string what = std::string(c.gram ? "gram " : "standard ") + std::to_string(c.rows) + "x" +
                             std::to_string(c.cols);
    std::vector<HostTensor> in;
    std::vector<std::unique_ptr<DeviceCopy>> din, dout;
    std::vector<double> reference;
    for (int64_t k = 0; k < count; ++k) {
      in.emplace_back(random_values(numel, 1.0, 90 + static_cast<uint64_t>(k)), DType::kFloat32);
      din.push_back(std::make_unique<DeviceCopy>(in.back()));
      dout.push_back(std::make_unique<DeviceCopy>(DType::kFloat32, numel));
      auto u = in.back().values();
      dmuon::ns::orthogonalize_cpu<double>(rule.schedule, u.data(), 1, c.rows, c.cols);
      reference.insert(reference.end(), u.begin(), u.end());
    }
    const dmuon::step::NsBatchDesc desc{c.rows, c.cols, count, DType::kFloat32, &rule.schedule, true};
    for (int run = 0; run < 4; ++run) {
      int fills = 0;
      gpu.orthogonalize(
          desc,
          [&](const dmuon::step::NsView& iterate, bool first) {
            EXPECT_EQ(first, fills++ == 0);
            std::vector<dmuon::step::WirePiece> pieces;
            for (int64_t k = 0; k < count; ++k) pieces.push_back({din[static_cast<size_t>(k)]->view(), k, 0, c.rows});
            gpu.iterate_from_pieces(pieces, desc, iterate, {});
          },
          [&](const dmuon::step::NsView& result) {
            std::vector<dmuon::step::WirePiece> pieces;
            for (int64_t k = 0; k < count; ++k) pieces.push_back({dout[static_cast<size_t>(k)]->view(), k, 0, c.rows});
            gpu.result_to_pieces(result, desc, pieces);
          });
      std::vector<double> got;
      for (const auto& d : dout) {
        const auto v = d->values();
        got.insert(got.end(), v.begin(), v.end());
      }
      // NOTE: 16-bit iterates (fp16 Gram, bf16 standard) against the same polynomial in fp64:
      // a few 1e-3 on these shapes; 3e-2 is the design's "within a few percent" bound.
      EXPECT_LE(dmuon::testing::relative_error(got, reference), 3e-2) << what << ", run " << run;
    }
  }
  const auto stats = gpu.graph_stats();
  EXPECT_GE(stats[1], 1) << "a batch's second run is captured";
  EXPECT_GE(stats[2], 1) << "and replayed from then on";
}

// float64 parameters are refused as the route decision says; float64 gradients the step
// only checks are checked in their own precision (1e300 is finite, NaN is not).
TEST(StepCudaOps, Float64IsCheckedButNotStepped) {
  SKIP_WITHOUT_GPU();
  CudaOps gpu;
  HostTensor g(std::vector<double>(5, 1e300), DType::kFloat64);
  const DeviceCopy dg(g), flags(DType::kInt32, 4);
  const std::string error = dmuon::testing::error_of([&] {
    gpu.check({{dg.view(), dg.view(), {0.95, true}, 0, true}}, flags.view());
  });
  EXPECT_NE(error.find("float64 parameters are not supported by the CUDA step ops"), std::string::npos) << error;
  g.set(3, NAN);
  const DeviceCopy bad(g);
  gpu.fill_zero(flags.view());
  gpu.check({{dg.view(), dg.view(), {}, 0, false}, {bad.view(), bad.view(), {}, 1, false}}, flags.view());
  EXPECT_EQ(gpu.read_flags({flags.view()}), (std::vector<int32_t>{0, 0, 1, 1}));
  const auto schedule = gram_schedule();
  const std::string ns_error = dmuon::testing::error_of([&] {
    gpu.orthogonalize({4, 4, 1, DType::kFloat64, &schedule, true}, [](const dmuon::step::NsView&, bool) {},
                      [](const dmuon::step::NsView&) {});
  });
  EXPECT_NE(ns_error.find("float64"), std::string::npos) << ns_error;
}

// ---------------------------------------------------------------- the whole engine
// Each rank's tensors on the GPU: parameters and momentum uploaded once, gradients each step.
struct DeviceRank {
  std::vector<std::unique_ptr<DeviceCopy>> param, grad, momentum;
  std::vector<dmuon::step::ParamTensors> views(const dmuon::testing::RankTensors& host) const {
    std::vector<dmuon::step::ParamTensors> out;
    for (size_t p = 0; p < param.size(); ++p)
      out.push_back({param[p]->view(), grad[p]->view(), momentum[p]->view(), host.has_grad[p]});
    return out;
  }
};

// An engine run on the GPU, with every rank's tensors after each step.
struct GpuRun : dmuon::testing::EngineRun {
  std::vector<std::vector<dmuon::testing::RankTensors>> after_step;  // [step − 1][rank]
};

GpuRun run_on_gpu(const dmuon::testing::World& world, const dmuon::step::EngineOptions& options,
                  const std::vector<dmuon::step::GroupRule>& rules, int num_steps,
                  const dmuon::testing::RunHooks& hooks = {}) {
  const int n = world.world_size();
  GpuRun run;
  run.after_step.assign(static_cast<size_t>(num_steps), std::vector<dmuon::testing::RankTensors>(static_cast<size_t>(n)));
  run.outcomes.resize(static_cast<size_t>(n));
  run.stats.resize(static_cast<size_t>(n));
  run.owners.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) run.tensors.push_back(world.local(r));
  // NOTE: ranks share one GPU; a collective waits for the whole device, then copies.
  dmuon::testing::LoopbackOptions loopback_options;
  loopback_options.copy = [](void* dst, const void* src, size_t bytes) {
    DMUON_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  };
  loopback_options.before_copy = [] { DMUON_CHECK_CUDA(cudaDeviceSynchronize()); };
  dmuon::testing::LoopbackWorld loopback(n, loopback_options);
  const auto specs = world.specs();
  run.errors = loopback.run([&](int r) {
    DMUON_CHECK_CUDA(cudaSetDevice(0));
    dmuon::step::CudaOps ops;
    dmuon::step::StepEngine engine(loopback.transport(r), ops, specs, options);
    run.owners[static_cast<size_t>(r)] = engine.owners();
    auto& host = run.tensors[static_cast<size_t>(r)];
    DeviceRank device;
    for (size_t p = 0; p < host.param.size(); ++p) {
      device.param.push_back(std::make_unique<DeviceCopy>(host.param[p]));
      device.momentum.push_back(std::make_unique<DeviceCopy>(host.momentum[p]));
      device.grad.push_back(nullptr);
    }
    for (int s = 1; s <= num_steps; ++s) {
      world.set_grads(r, s, host);
      if (hooks.before_step) hooks.before_step(r, s, host);
      for (size_t p = 0; p < host.param.size(); ++p) device.grad[p] = std::make_unique<DeviceCopy>(host.grad[p]);
      run.outcomes[static_cast<size_t>(r)].push_back(engine.step(device.views(host), rules, s));
      run.stats[static_cast<size_t>(r)] = engine.last_stats();
      for (size_t p = 0; p < host.param.size(); ++p) {
        device.param[p]->download(host.param[p]);
        device.momentum[p]->download(host.momentum[p]);
      }
      run.after_step[static_cast<size_t>(s - 1)][static_cast<size_t>(r)] = host;
    }
  });
  return run;
}

std::vector<dmuon::testing::ModelParam> gpu_model(DType dtype) {
  return {
      {"wide", {64, 200}, 0, true, dtype, 0},  {"tall", {200, 64}, 0, true, dtype, 0},
      {"square_a", {96, 96}, 0, true, dtype, 0}, {"square_b", {96, 96}, 0, true, dtype, 0},
      {"uneven", {37, 50}, 0, true, dtype, 0},  {"experts", {3, 32, 48}, 1, true, dtype, 0},
      {"replicated", {40, 56}, 0, false, dtype, 0}, {"standard", {48, 72}, 0, true, dtype, 1},
  };
}

std::vector<dmuon::step::GroupRule> gpu_rules(double lr) {
  return {dmuon::testing::gram_rule(lr, 0.01, true, "original"),
          dmuon::testing::standard_rule(lr, 0.0, false, "match_rms_adamw")};
}

// Every rank ran without error and applied every step; each parameter's total update and
// momentum against the fp64 Muon run (step_expect.h). NOTE: the 16-bit NS iterate (and a
// bf16 wire at world 2) against fp64: a few 1e-3 per step on these shapes; bf16 parameters
// add their own rounding (lr 0.5 keeps the update above it, as in the CPU test, which
// measured 2.6e-2 there).
void expect_applied_and_close_to_fp64_muon(const dmuon::testing::World& world, const GpuRun& run,
                                           const std::vector<dmuon::step::GroupRule>& rules, int num_steps) {
  for (size_t r = 0; r < run.errors.size(); ++r) {
    ASSERT_EQ(run.errors[r], "") << "rank " << r;
    for (const auto& o : run.outcomes[r]) EXPECT_TRUE(o.applied()) << o.message;
  }
  dmuon::testing::expect_matches_reference(world, run, rules, num_steps, [](const dmuon::testing::ModelParam& p) {
    const bool bf16 = p.dtype == DType::kBFloat16;
    return std::make_pair(bf16 ? 8e-2 : 3e-2, bf16 ? 6e-3 : 1e-6);
  });
}

// Engine options of runs whose ranks share one GPU: LPT, several stages, and no CUDA graphs
// (one thread's graph capture must not meet another's device-wide synchronization, the
// loopback's copies; the one-rank runs cover the graphs).
dmuon::step::EngineOptions ranks_sharing_one_gpu() {
  dmuon::step::EngineOptions options;
  options.solver = dmuon::plan::SolverKind::kLpt;
  options.stage_bytes = 64 << 10;
  options.graphs = false;
  return options;
}

TEST(StepCudaEngine, MatchesFp64MuonAtWorldsOneAndTwo) {
  SKIP_WITHOUT_GPU();
  for (int world_size : {1, 2}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const bool bf16 = dtype == DType::kBFloat16;
      const dmuon::testing::World world(gpu_model(dtype), world_size, 3, 321);
      dmuon::step::EngineOptions options = ranks_sharing_one_gpu();  // NOTE: several stages at world 2
      options.graphs = world_size == 1;
      const auto rules = gpu_rules(bf16 ? 0.5 : 0.02);
      const auto run = run_on_gpu(world, options, rules, 3);
      SCOPED_TRACE("world " + std::to_string(world_size));
      expect_applied_and_close_to_fp64_muon(world, run, rules, 3);
    }
  }
}

// Phases timed by device marks (step/phase_clock.h, what the fake-world benchmark records):
// the same bytes as the untimed step, and every stage's prepare and NS positive device time.
TEST(StepCudaEngine, DeviceTimedPhasesChangeNothingAndAreFilledIn) {
  SKIP_WITHOUT_GPU();
  const dmuon::testing::World world(gpu_model(DType::kFloat32), 2, 2, 77);
  dmuon::step::EngineOptions options = ranks_sharing_one_gpu();
  const auto rules = gpu_rules(0.02);
  const auto untimed = run_on_gpu(world, options, rules, 2);
  options.timing = dmuon::step::PhaseTiming::kDevice;
  const auto timed = run_on_gpu(world, options, rules, 2);
  for (size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(timed.errors[r], "") << "rank " << r;
    for (size_t p = 0; p < timed.tensors[r].param.size(); ++p)
      EXPECT_EQ(timed.tensors[r].param[p].bytes(), untimed.tensors[r].param[p].bytes()) << "rank " << r << ", param " << p;
    const auto& stats = timed.stats[r];
    ASSERT_GT(stats.stages.size(), 1u);
    double ns = 0;
    for (const auto& line : stats.stages) {
      EXPECT_GT(line.prepare_s, 0.0) << "rank " << r << ", stage " << line.stage_idx;
      ns += line.ns_s;
    }
    EXPECT_GT(ns, 0.0) << "rank " << r;
    EXPECT_NEAR(stats.ns_s, ns, 1e-9) << "rank " << r;
  }
}

TEST(StepCudaOps, MarksTimeTheDeviceAndAreReusedAfterClear) {
  SKIP_WITHOUT_GPU();
  CudaOps gpu;
  ASSERT_TRUE(gpu.device_marks());
  auto buffer = gpu.allocate(DType::kFloat32, int64_t{1} << 26);
  const int64_t a = gpu.record_mark();
  for (int k = 0; k < 8; ++k) gpu.fill_synthetic(buffer.get(), 1 + k);
  const int64_t b = gpu.record_mark();
  const double seconds = gpu.mark_seconds(a, b);
  EXPECT_GT(seconds, 0.0);
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(dmuon::testing::error_of([&] { gpu.mark_seconds(a, b + 1); }).find("mark"), std::string::npos);
  gpu.clear_marks();
  EXPECT_EQ(gpu.record_mark(), 0) << "ids are given again after clear_marks()";
}

// The planner's NS costs on the GPU (step/cost_profile.h): device time, the NS batch replayed
// from its graph (the first warm-up run tunes, the second captures), kept in the store
// under the autotuner's environment (the GPU, driver and runtime its configurations were
// tuned on).
TEST(StepCudaOps, CostProfileTimesReplayedGraphsIntoTheAutotunersEnvironment) {
  SKIP_WITHOUT_GPU();
  CudaOps gpu;
  const dmuon::step::MeasurementStore store = gpu.measurement_store();
  EXPECT_EQ(store.environment.describe().rfind("gpu ", 0), 0u) << store.environment.describe();
  EXPECT_NE(store.environment.driver, "");
  const dmuon::ns::Schedule schedule = dmuon::testing::gram_rule(0.02, 0.0).schedule;
  dmuon::step::CostOptions options;
  options.store_path = ::testing::TempDir() + "/dmuon_cuda_cost_profile_" + std::to_string(::getpid()) + ".txt";
  options.num_runs = 3;
  const std::vector<dmuon::step::CostPoint> points{{64, 200, 1, DType::kFloat32, &schedule},
                                                   {200, 64, 3, DType::kBFloat16, &schedule}};
  const std::vector<int64_t> before = gpu.graph_stats();
  const auto table = dmuon::step::measure_ns_costs(gpu, points, DType::kBFloat16, true, options);
  const std::vector<int64_t> after = gpu.graph_stats();
  for (const auto& [rows, cols, count, seconds] : table.entries()) {
    EXPECT_GT(seconds, 0.0) << rows << "x" << cols;
    EXPECT_LT(seconds, 1.0) << rows << "x" << cols;
  }
  EXPECT_EQ(after[1] - before[1], 2) << "one capture per point";
  // NOTE: the capturing run launches its graph too: 1 + num_runs replays per point.
  EXPECT_EQ(after[2] - before[2], 2 * (1 + options.num_runs)) << "every timed run a replay";
  std::ifstream in(options.store_path);
  std::stringstream text;
  text << in.rdbuf();
  std::string why;
  const auto parsed = dmuon::autotune::parse_cache_text(text.str(), store.environment, &why);
  ASSERT_TRUE(parsed.has_value()) << why;
  EXPECT_EQ(parsed->size(), 2u);
  std::remove(options.store_path.c_str());
  std::remove((options.store_path + ".lock").c_str());
}

// Column blocks (split_heads with split_dim=1: per-head o_proj) on the CUDA ops: each rank's
// piece of a block is strided in its local tensor (check, prepare, the local iterate and
// both applies read and write it in place); sharded unevenly, replicated, bfloat16, at
// worlds 1 and 3 against the fp64 Muon run block by block, with the bounds above.
TEST(StepCudaEngine, ColumnBlocksAsStridedPiecesMatchFp64Muon) {
  SKIP_WITHOUT_GPU();
  std::vector<dmuon::testing::ModelParam> model = {
      {"o_proj", {40, 96}, 0, true, DType::kFloat32, 0}, {"o_replicated", {24, 72}, 0, false, DType::kFloat32, 0},
      {"o_half", {32, 64}, 0, true, DType::kBFloat16, 0}, {"plain", {40, 32}, 0, true, DType::kFloat32, 0}};
  model[0].col_blocks = 3;
  model[1].col_blocks = 3;
  model[2].col_blocks = 2;
  for (int world_size : {1, 3}) {
    const dmuon::testing::World world(model, world_size, 2, 77);
    dmuon::step::EngineOptions options = ranks_sharing_one_gpu();
    options.stage_bytes = 8 << 10;  // NOTE: several stages at world 3
    options.graphs = world_size == 1;
    const auto rules = gpu_rules(0.5);
    const auto run = run_on_gpu(world, options, rules, 2);
    SCOPED_TRACE("world " + std::to_string(world_size));
    expect_applied_and_close_to_fp64_muon(world, run, rules, 2);
  }
}

// The mesh layouts on the CUDA ops: column blocks (TP rowwise), FSDP2's strided shard
// over TP, HSDP and TP replicas, experts whole on a rank, on a 2x2 mesh (world 4, one GPU);
// replicas must stay bit-identical under the 16-bit wire (gather() throws where not).
TEST(StepCudaEngine, MeshPlacementsMatchFp64MuonAtWorldFour) {
  SKIP_WITHOUT_GPU();
  using dmuon::layout::DimPlacement;
  using dmuon::layout::PlacementKind;
  const DimPlacement rep{PlacementKind::kReplicate, 0, 1}, s0{PlacementKind::kShard, 0, 1},
      s1{PlacementKind::kShard, 1, 1}, strided{PlacementKind::kStridedShard, 0, 2};
  auto placed = [](dmuon::testing::ModelParam m, std::vector<DimPlacement> placements) {
    m.mesh = dmuon::layout::MeshPlacement{{2, 2}, std::move(placements), {{0, 0}, {0, 1}, {1, 0}, {1, 1}}};
    return m;
  };
  const DType f32 = DType::kFloat32;
  const std::vector<dmuon::testing::ModelParam> model = {
      placed({"colwise", {90, 64}, 0, true, f32, 0}, {strided, s0}),
      placed({"rowwise", {64, 90}, 0, true, f32, 0}, {s0, s1}),
      placed({"hsdp", {70, 48}, 0, true, f32, 1}, {rep, s0}),
      placed({"tp_replicated", {48, 70}, 0, true, f32, 0}, {rep, s1}),
      placed({"experts", {4, 32, 48}, 1, true, f32, 0}, {s0, s0}),
  };
  const dmuon::testing::World world(model, 4, 2, 28);
  const auto rules = gpu_rules(0.02);
  // NOTE: MatchesFp64MuonAtWorldsOneAndTwo's float32 bounds (16-bit iterate and wire).
  expect_applied_and_close_to_fp64_muon(world, run_on_gpu(world, ranks_sharing_one_gpu(), rules, 2), rules, 2);
}

TEST(StepCudaEngine, NonFiniteGradientBehindTheGateChangesNothing) {
  SKIP_WITHOUT_GPU();
  const dmuon::testing::World world(gpu_model(DType::kFloat32), 1, 2, 5);
  dmuon::testing::RunHooks hooks;
  hooks.before_step = [](int, int s, dmuon::testing::RankTensors& t) {
    if (s == 2) t.grad[4].set(17, NAN);
  };
  dmuon::step::EngineOptions options;
  const auto rules = gpu_rules(0.02);
  // Step 1 as usual, step 2 refused behind the gate: every byte as after step 1.
  const auto run = run_on_gpu(world, options, rules, 2, hooks);
  ASSERT_EQ(run.errors[0], "");
  ASSERT_EQ(run.outcomes[0].size(), 2u);
  EXPECT_TRUE(run.outcomes[0][0].applied());
  EXPECT_EQ(run.outcomes[0][1].status, dmuon::step::StepOutcome::Status::kNonFiniteGradient);
  EXPECT_EQ(run.outcomes[0][1].nonfinite_params, std::vector<int>{4});
  const auto& before = run.after_step[0][0];
  const auto& after = run.after_step[1][0];
  for (size_t p = 0; p < world.model().size(); ++p) {
    EXPECT_EQ(after.param[p].bytes(), before.param[p].bytes()) << world.model()[p].name;
    EXPECT_EQ(after.momentum[p].bytes(), before.momentum[p].bytes()) << world.model()[p].name;
  }
}

}  // namespace
