// Tests of ns/ns_bound.h: the kernels a Newton–Schulz run launches, their FLOPs (checked
// against plan::ns_flops, an independent formula) and their bytes (counted by hand).
#include "ns/ns_bound.h"

#include <gtest/gtest.h>

#include "common/check.h"
#include "plan/cost_model.h"

namespace dmuon::ns {
namespace {

double sum_flops(const std::vector<KernelWork>& kernels) {
  double total = 0.0;
  for (const KernelWork& k : kernels) total += k.flops;
  return total;
}

int count_kind(const std::vector<KernelWork>& kernels, KernelKind kind) {
  int count = 0;
  for (const KernelWork& k : kernels) count += k.kind == kind ? 1 : 0;
  return count;
}

double sum_bytes(const std::vector<KernelWork>& kernels) {
  double total = 0.0;
  for (const KernelWork& k : kernels) total += k.bytes;
  return total;
}

TEST(NsBound, FlopsMatchTheCostModelsFormulas) {
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);  // restart after 2
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{96, 512}, {512, 96}, {128, 128}}) {
    EXPECT_DOUBLE_EQ(sum_flops(ns_kernel_work(gram, Algorithm::kGram, rows, cols)),
                     plan::ns_flops(rows, cols, plan::NsFlavor::kGram, /*symmetric=*/true));
    EXPECT_DOUBLE_EQ(sum_flops(ns_kernel_work(gram, Algorithm::kStandard, rows, cols)),
                     plan::ns_flops(rows, cols, plan::NsFlavor::kStandard, /*symmetric=*/true));
  }
}

// Gram, 5 steps, restart after 2 (M = one m×m matrix, X = one m×n iterate, 2 bytes each):
// X·Xᵀ X+M; step 1: Z 2M, Q = Z + aI 2M, S 3M, R 3M; step 2: Z 2M, Q 3M, X ← Q·X M+2X,
// X·Xᵀ X+M; step 3 as step 1 (10M); step 4: Z, Q, S, R 11M; step 5: Z, Q 5M; Q·X M+2X.
// In all 45M + 6X over 20 kernels. Standard, per step: X·Xᵀ X+M, B = c·A² + b·A 2M (A read
// once), X ← B·X + a·X M+2X: 15X + 20M over 15 kernels.
TEST(NsBound, BytesAndKernelsAsCountedByHand) {
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);
  const int64_t m = 96, n = 512;
  const double mat = 2.0 * m * m, iterate = 2.0 * m * n;
  const auto g = ns_kernel_work(gram, Algorithm::kGram, m, n);
  EXPECT_EQ(g.size(), 20u);
  EXPECT_DOUBLE_EQ(sum_bytes(g), 45 * mat + 6 * iterate);
  // 16 symmetric products (two X·Xᵀ, 14 m×m), two Q·X, two Q = Z + a·I.
  EXPECT_EQ(count_kind(g, KernelKind::kSymmetric), 16);
  EXPECT_EQ(count_kind(g, KernelKind::kDense), 2);
  EXPECT_EQ(count_kind(g, KernelKind::kElementwise), 2);
  const auto s = ns_kernel_work(gram, Algorithm::kStandard, m, n);
  EXPECT_EQ(s.size(), 15u);
  EXPECT_DOUBLE_EQ(sum_bytes(s), 20 * mat + 15 * iterate);
  EXPECT_EQ(count_kind(s, KernelKind::kSymmetric), 10);
  EXPECT_EQ(count_kind(s, KernelKind::kDense), 5);
  // Tall matrices run transposed: the same kernels.
  const auto tall = ns_kernel_work(gram, Algorithm::kGram, n, m);
  EXPECT_DOUBLE_EQ(sum_bytes(tall), sum_bytes(g));
  // fp32 iterates move twice the bytes, the same FLOPs.
  EXPECT_DOUBLE_EQ(sum_bytes(ns_kernel_work(gram, Algorithm::kGram, m, n, 4)), 2 * sum_bytes(g));
}

TEST(NsBound, EachKernelAtTheLargerOfItsTwoTimes) {
  const std::vector<KernelWork> kernels{{2e12, 1e9}, {1e9, 4e9}};
  // 2e12 FLOPs at 1e15/s = 2 ms (its 1 GB at 2e12 B/s: 0.5 ms); 4 GB at 2e12 B/s = 2 ms.
  EXPECT_DOUBLE_EQ(kernels_bound_seconds(kernels, 1e15, 2e12), 4e-3);
}

TEST(NsBound, StepBoundPicksWhatTheCudaBackendMayRun) {
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);
  const double peak = 775e12, bw = 4.26e12;
  // Square Gram schedules run the standard iteration (cuda_backend.cu): its FLOPs only.
  const StepBound square = fused_step_bound({{512, 512}}, gram, peak, bw);
  EXPECT_DOUBLE_EQ(square.ns_flops, plan::ns_flops(512, 512, plan::NsFlavor::kStandard, true));
  EXPECT_DOUBLE_EQ(square.pass_bytes, kFusedStepPassBytesPerParam * 512 * 512);
  EXPECT_DOUBLE_EQ(square.passes_seconds, square.pass_bytes / bw);
  // Wide: the cheaper of the two iterations; here Gram (m/n small).
  const StepBound wide = fused_step_bound({{896, 4864}}, gram, peak, bw);
  const double gram_s = kernels_bound_seconds(ns_kernel_work(gram, Algorithm::kGram, 896, 4864), peak, bw);
  const double standard_s = kernels_bound_seconds(ns_kernel_work(gram, Algorithm::kStandard, 896, 4864), peak, bw);
  EXPECT_LT(gram_s, standard_s);
  EXPECT_DOUBLE_EQ(wide.ns_seconds, gram_s);
  EXPECT_DOUBLE_EQ(wide.ns_flops, plan::ns_flops(896, 4864, plan::NsFlavor::kGram, true));
  // The parts by primitive add up to the NS floor; a square standard run has no add_identity.
  EXPECT_NEAR(wide.sym_seconds + wide.dense_seconds + wide.elementwise_seconds, wide.ns_seconds, 1e-15);
  EXPECT_GT(wide.elementwise_seconds, 0.0);
  EXPECT_NEAR(square.sym_seconds + square.dense_seconds, square.ns_seconds, 1e-15);
  EXPECT_EQ(square.elementwise_seconds, 0.0);
  // Matrices add up.
  const StepBound both = fused_step_bound({{512, 512}, {896, 4864}}, gram, peak, bw);
  EXPECT_DOUBLE_EQ(both.seconds(), square.seconds() + wide.seconds());
}

TEST(NsBound, BadInputsNameTheirParameter) {
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);
  EXPECT_THROW(ns_kernel_work(gram, Algorithm::kGram, 0, 10), Error);
  EXPECT_THROW(fused_step_bound({{4, 4}}, gram, 1e15, 0.0), Error);
  try {
    fused_step_bound({{4, 4}}, gram, -1.0, 1e12);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flops_per_second"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dmuon::ns
