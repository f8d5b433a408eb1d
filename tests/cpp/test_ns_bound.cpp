// Tests of ns/ns_bound.h: the kernels a Newton–Schulz run launches, their FLOPs (checked
// against plan::ns_flops, an independent formula) and their bytes (counted by hand).
#include "ns/ns_bound.h"

#include <gtest/gtest.h>

#include <algorithm>

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

TEST(NsBound, KernelsCarryTheShapeOfTheirProduct) {
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);
  const int64_t m = 96, n = 512;
  const auto g = ns_kernel_work(gram, Algorithm::kGram, n, m);  // tall: runs as 96×512
  // First X·Xᵀ: symmetric m×m over k = n, one operand, no C; last Q·X: dense m×n over k = m.
  const ProductShape first = g.front().product, last = g.back().product;
  EXPECT_EQ(first, (ProductShape{KernelKind::kSymmetric, 1, m, m, n, false, true}));
  EXPECT_EQ(last, (ProductShape{KernelKind::kDense, 1, m, n, m, false, false}));
  for (const KernelWork& k : g) {
    if (k.kind == KernelKind::kElementwise) continue;
    const ProductShape& p = k.product;
    EXPECT_EQ(p.kind, k.kind);
    // A product's FLOPs from its shape: dense 2mnk, symmetric half of it (n = m).
    EXPECT_DOUBLE_EQ(k.flops, (k.kind == KernelKind::kSymmetric ? 1.0 : 2.0) * p.m * p.n * p.k);
  }
  // Standard: B·X + a·X carries its C.
  const auto s = ns_kernel_work(gram, Algorithm::kStandard, m, n);
  EXPECT_EQ(s[2].product, (ProductShape{KernelKind::kDense, 1, m, n, m, true, false}));
}

TEST(NsBound, StepProductsAreDistinctAndCarryTheBatchCount) {
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);
  const auto products = step_products({{8, 96, 512}, {8, 512, 96}, {3, 64, 64}}, gram);
  // The two wide batches are the same products (both iterations); the square batch runs
  // standard only: X·Xᵀ, A² + b·A, B·X + a·X.
  const auto wide = step_products({{8, 96, 512}}, gram);
  const auto square = step_products({{3, 64, 64}}, gram);
  EXPECT_EQ(square.size(), 3u);
  EXPECT_EQ(products.size(), wide.size() + square.size());
  EXPECT_TRUE(std::is_sorted(products.begin(), products.end()));
  EXPECT_TRUE(std::adjacent_find(products.begin(), products.end()) == products.end());
  for (const ProductShape& p : square) EXPECT_EQ(p.batch, 3);
  for (const ProductShape& p : wide) EXPECT_EQ(p.batch, 8);
}

TEST(NsBound, MeasuredBoundAtPeakTimesIsThePeakBound) {
  // Each product timed at its dense FLOPs at one rate: the measured floor is the peak floor
  // at that rate (a symmetric product at half the dense time is its own FLOPs at the rate).
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);
  const double rate = 700e12, bw = 4e12;
  const std::vector<NsBatch> batches{{4, 896, 4864}, {2, 896, 896}, {3, 128, 896}};
  std::vector<double> dense;
  for (const ProductShape& p : step_products(batches, gram))
    dense.push_back(2.0 * static_cast<double>(p.batch) * p.m * p.n * p.k / rate);
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const NsBatch& b : batches)
    for (int64_t i = 0; i < b.count; ++i) shapes.emplace_back(b.rows, b.cols);
  const StepBound measured = measured_step_bound(batches, gram, dense, bw);
  const StepBound peak = fused_step_bound(shapes, gram, rate, bw);
  EXPECT_NEAR(measured.seconds(), peak.seconds(), 1e-12);
  EXPECT_NEAR(measured.sym_seconds, peak.sym_seconds, 1e-12);
  EXPECT_NEAR(measured.dense_seconds, peak.dense_seconds, 1e-12);
  EXPECT_NEAR(measured.elementwise_seconds, peak.elementwise_seconds, 1e-12);
  EXPECT_DOUBLE_EQ(measured.ns_flops, peak.ns_flops);
  EXPECT_DOUBLE_EQ(measured.pass_bytes, peak.pass_bytes);
  // Twice the time for every product: the products' part doubles where no product is held
  // at its bytes (a copy rate that never binds), the passes stay.
  std::vector<double> slower(dense);
  for (double& t : slower) t *= 2;
  const double fast_copy = 1e18;
  const StepBound at_rate = measured_step_bound(batches, gram, dense, fast_copy);
  const StepBound half_rate = measured_step_bound(batches, gram, slower, fast_copy);
  EXPECT_NEAR(half_rate.sym_seconds, 2 * at_rate.sym_seconds, 1e-12);
  EXPECT_NEAR(half_rate.dense_seconds, 2 * at_rate.dense_seconds, 1e-12);
  EXPECT_DOUBLE_EQ(half_rate.passes_seconds, at_rate.passes_seconds);
  // With the real copy rate some small products are held at their bytes: less than double.
  const StepBound bound_by_bytes = measured_step_bound(batches, gram, slower, bw);
  EXPECT_GT(bound_by_bytes.ns_seconds, measured.ns_seconds);
  EXPECT_LE(bound_by_bytes.ns_seconds, 2 * measured.ns_seconds);
}

TEST(NsBound, MeasuredBoundNamesBadTimes) {
  const Schedule gram = default_schedule(Algorithm::kGram, 5, 1e-7);
  const std::vector<NsBatch> batches{{2, 64, 64}};
  const size_t n = step_products(batches, gram).size();
  auto message = [&](const std::vector<NsBatch>& b, const std::vector<double>& t, double bw) -> std::string {
    try {
      measured_step_bound(b, gram, t, bw);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message(batches, std::vector<double>(n + 1, 1e-3), 1e12).find("dense_seconds has"), std::string::npos);
  std::vector<double> bad(n, 1e-3);
  bad[1] = 0.0;
  EXPECT_NE(message(batches, bad, 1e12).find("dense_seconds[1]"), std::string::npos);
  EXPECT_NE(message(batches, std::vector<double>(n, 1e-3), 0.0).find("bytes_per_second"), std::string::npos);
  EXPECT_NE(message({{0, 64, 64}}, {}, 1e12).find("count"), std::string::npos);
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
