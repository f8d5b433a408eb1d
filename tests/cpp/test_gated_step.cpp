// The one-GPU gated step's decisions (csrc/optim/gated_step.h), on the host: which tensors
// take the fused path, the stream count, and the warm-batches rule of stream assignment.
#include "optim/gated_step.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_of.h"
#include "ns/batch_streams.h"
#include "ns/ns_bound.h"

namespace dmuon::optim {
namespace {

using dmuon::testing::error_of;

FusedTensor cuda_matrix(std::vector<int64_t> sizes = {64, 96}, int64_t device = 0) {
  FusedTensor t;
  t.defined = t.cuda = t.float32 = t.contiguous = true;
  t.device = device;
  t.sizes = std::move(sizes);
  return t;
}

TEST(GatedStep, ContiguousFp32CudaMatricesOfOneShapeTakeTheFusedPath) {
  const FusedTensor p = cuda_matrix();
  EXPECT_TRUE(fused_path_takes(p, p, p, true, true));
  EXPECT_TRUE(fused_path_takes(p, p, FusedTensor{}, true, true));  // the buffer is made on the first step
  EXPECT_TRUE(fused_path_takes(cuda_matrix({4, 8, 16}), cuda_matrix({4, 8, 16}), FusedTensor{}, true, true));
}

TEST(GatedStep, EveryReasonAgainstTheFusedPathIsHonoured) {
  const FusedTensor p = cuda_matrix();
  EXPECT_FALSE(fused_path_takes(p, p, p, false, true));   // DMUON_FUSED_STEP=0
  EXPECT_FALSE(fused_path_takes(p, p, p, true, false));   // no usable sm_90a kernel
  EXPECT_FALSE(fused_path_takes(FusedTensor{}, p, p, true, true));
  EXPECT_FALSE(fused_path_takes(p, FusedTensor{}, p, true, true));  // no gradient
  const FusedTensor vector = cuda_matrix({64});
  EXPECT_FALSE(fused_path_takes(vector, vector, vector, true, true));
  FusedTensor cpu = p;
  cpu.cuda = false, cpu.device = -1;
  EXPECT_FALSE(fused_path_takes(cpu, cpu, cpu, true, true));
  for (int what = 0; what < 3; ++what) {
    for (int fault = 0; fault < 4; ++fault) {
      FusedTensor bad = p;
      if (fault == 0) bad.float32 = false;
      if (fault == 1) bad.contiguous = false;
      if (fault == 2) bad.device = 1;
      if (fault == 3) bad.sizes = {96, 64};
      const FusedTensor& param = what == 0 ? bad : p;
      const FusedTensor& grad = what == 1 ? bad : p;
      const FusedTensor& momentum = what == 2 ? bad : p;
      // NOTE: a parameter on device 1 with tensors on device 0 is the same mismatch.
      EXPECT_FALSE(fused_path_takes(param, grad, momentum, true, true)) << "tensor " << what << " fault " << fault;
    }
  }
}

TEST(GatedStep, StreamCountIsTheRequestElseTheKnobAndBothAreChecked) {
  EXPECT_EQ(gated_stream_count(3, 2), 3);
  EXPECT_EQ(gated_stream_count(0, 2), 2);
  EXPECT_EQ(gated_stream_count(0, 8), 8);
  EXPECT_EQ(gated_stream_count(5, 100), 5);  // the knob is not read when a count is requested
  EXPECT_NE(error_of([] { gated_stream_count(0, 0); }).find("DMUON_FUSED_STREAMS must be between 1 and 8, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { gated_stream_count(0, 9); }).find("DMUON_FUSED_STREAMS"), std::string::npos);
  EXPECT_NE(error_of([] { gated_stream_count(9, 2); }).find("fused_streams must be between 1 and 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { gated_stream_count(-1, 2); }).find("fused_streams"), std::string::npos);
}

std::vector<ns::Schedule> two_groups() {
  return {ns::default_schedule(ns::Algorithm::kGram, 5, 1e-7), ns::default_schedule(ns::Algorithm::kStandard, 5, 1e-7)};
}

TEST(GatedStep, NewBatchesRunOnOneStreamUntilTheyComeAgain) {
  const std::vector<GatedBatch> batches = {{0, 896, 4864, 24}, {0, 4864, 896, 24}, {1, 896, 896, 48}};
  const std::vector<int> zeros(batches.size(), 0);
  // The first gated step (nothing warm), and a step whose batches differ from the last one's
  // in any way: every batch on stream 0.
  EXPECT_EQ(gated_batch_streams(batches, {}, two_groups(), 2), zeros);
  for (int field = 0; field < 4; ++field) {
    std::vector<GatedBatch> warm = batches;
    if (field == 0) warm[1].group = 1;
    if (field == 1) warm[1].rows = 4865;
    if (field == 2) warm[1].cols = 897;
    if (field == 3) warm[1].num_matrices = 23;
    EXPECT_EQ(gated_batch_streams(batches, warm, two_groups(), 2), zeros) << "field " << field;
  }
  std::vector<GatedBatch> reordered = {batches[1], batches[0], batches[2]};
  EXPECT_EQ(gated_batch_streams(batches, reordered, two_groups(), 2), zeros);
  std::vector<GatedBatch> fewer = {batches[0], batches[1]};
  EXPECT_EQ(gated_batch_streams(batches, fewer, two_groups(), 2), zeros);
}

TEST(GatedStep, WarmBatchesSpreadByTheirFloorsWithEachShapeOnOneStream) {
  // Two parts of one large shape (a batch split by the workspace bound) and two small shapes.
  const std::vector<GatedBatch> batches = {
      {0, 1536, 8960, 14}, {0, 1536, 8960, 14}, {0, 256, 1536, 8}, {1, 1536, 1536, 28}};
  const std::vector<ns::Schedule> schedules = two_groups();
  const std::vector<int> s = gated_batch_streams(batches, batches, schedules, 2);
  ASSERT_EQ(s.size(), batches.size());
  EXPECT_EQ(s[0], s[1]);  // one shape, one stream (its workspace and CUDA graph exist once)
  // The same answer as assign_streams over the batches' fused-step floors.
  std::vector<ns::StreamJob> jobs;
  const int64_t keys[] = {0, 0, 1, 2};
  for (size_t k = 0; k < batches.size(); ++k) {
    const auto& b = batches[k];
    const std::vector<std::pair<int64_t, int64_t>> shapes(static_cast<size_t>(b.num_matrices), {b.rows, b.cols});
    jobs.push_back({keys[k], ns::fused_step_bound(shapes, schedules[static_cast<size_t>(b.group)], 775e12, 4.0e12)
                                 .seconds()});
  }
  EXPECT_EQ(s, ns::assign_streams(jobs, 2));
  EXPECT_NE(s[0], s[2]);  // the largest shape has a stream to itself here
  EXPECT_EQ(gated_batch_streams(batches, batches, schedules, 1), std::vector<int>(batches.size(), 0));
  // The same shape in two param groups is two keys.
  const std::vector<GatedBatch> same_shape = {{0, 512, 512, 4}, {1, 512, 512, 4}};
  const std::vector<int> t = gated_batch_streams(same_shape, same_shape, schedules, 2);
  EXPECT_NE(t[0], t[1]);
  EXPECT_NE(error_of([&] { gated_batch_streams({{2, 8, 8, 1}}, {{2, 8, 8, 1}}, schedules, 2); }).find("group 2"),
            std::string::npos);
}

}  // namespace
}  // namespace dmuon::optim
