// tests/cpp/test_step_memory.cpp — the one-GPU step's device memory, counted on any
// machine: the step engine over ops that compute nothing and take every byte the CUDA ops
// would (the engine's buffers, their own scratch, the NS workspaces kept per stream by
// step/cuda/stream_workspaces.h) from a counting allocator; and those workspaces alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loopback_transport.h"
#include "step/cuda/stream_workspaces.h"
#include "step/engine.h"
#include "step_world.h"

namespace {

using dmuon::step::Buffer;
using dmuon::step::DType;
using dmuon::step::OwnedBuffer;
using dmuon::step::cuda::StreamWorkspaces;

constexpr size_t kMiB = size_t{1} << 20;

// Device memory that is never touched: distinct fake addresses, live and peak bytes.
class CountingAllocator : public dmuon::step::cuda::Allocator {
 public:
  void* allocate(size_t bytes, void*) override {
    void* ptr = reinterpret_cast<void*>(next_);
    next_ += (bytes + 511) / 512 * 512;
    live_[ptr] = bytes;
    live_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
    return ptr;
  }
  void release(void* ptr, size_t, void*) override {
    const auto it = live_.find(ptr);
    if (it == live_.end()) {
      ++num_bad_releases_;
      return;
    }
    live_bytes_ -= it->second;
    live_.erase(it);
  }
  size_t live_bytes() const { return live_bytes_; }
  size_t peak_bytes() const { return peak_bytes_; }
  int num_bad_releases() const { return num_bad_releases_; }

 private:
  uintptr_t next_ = uintptr_t{1} << 44;
  std::map<void*, size_t> live_;
  size_t live_bytes_ = 0, peak_bytes_ = 0;
  int num_bad_releases_ = 0;
};

// 16-bit elements padded to 8 per row, as the CUDA backend lays its iterates out.
int64_t padded_ld(int64_t cols) { return (cols + 7) / 8 * 8; }
size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The Gram NS workspace of `count` rows×cols matrices, from the layout the CUDA backend
// carves (ns/cuda/cuda_backend.cu): the norms, two m×n iterates and five m×m products in
// 16 bits (m ≤ n, 256-byte aligned regions) and the 32 MiB cuBLASLt scratch.
size_t gram_workspace_bytes(int64_t rows, int64_t cols, int64_t count) {
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  const size_t mn = static_cast<size_t>(count * m * padded_ld(n)) * 2, mm = static_cast<size_t>(count * m * padded_ld(m)) * 2;
  return align256(4 * static_cast<size_t>(count)) + 2 * align256(mn) + 5 * align256(mm) + 32 * kMiB;
}

// The CUDA ops' memory and nothing else: every buffer and scratch they would take (on the
// stream they would take it on), the NS workspace from a StreamWorkspaces as their graph
// cache takes it; no pass computes anything.
class CountingOps : public dmuon::step::DeviceOps {
 public:
  explicit CountingOps(CountingAllocator& allocator)
      : allocator_(allocator), workspaces_(allocator, size_t{8192} * kMiB) {}
  int max_streams() const { return max_streams_; }

  dmuon::step::Device device() const override { return {dmuon::step::DeviceKind::kCuda, 0}; }
  OwnedBuffer allocate(DType dtype, int64_t numel) override {
    Buffer b{nullptr, dtype, numel, device()};
    if (numel == 0) return OwnedBuffer(b, nullptr);
    void* stream = current_stream();
    b.data = allocator_.allocate(static_cast<size_t>(b.bytes()), stream);
    return OwnedBuffer(b, [this, stream](const Buffer& x) { allocator_.release(x.data, static_cast<size_t>(x.bytes()), stream); });
  }
  void fill_zero(const Buffer&) override {}
  void fill_synthetic(const Buffer&, uint64_t) override {}
  void copy(const std::vector<dmuon::step::CopyPiece>&) override {}
  void sum_into(const Buffer&, int64_t, int64_t, const Buffer&, double, bool) override {}
  // NOTE: the CUDA ops' partial sums: a float per 16384 elements of every summed piece.
  dmuon::step::Partials check(const std::vector<dmuon::step::CheckPiece>& pieces, const Buffer&) override {
    dmuon::step::Partials out;
    int64_t total = 0;
    for (const auto& p : pieces)
      if (p.sum_update) {
        out.offset.push_back(total);
        out.count.push_back(chunks(p.grad.numel));
        total += out.count.back();
      }
    out.buffer = allocate(DType::kFloat32, std::max<int64_t>(1, total));
    return out;
  }
  void fingerprint(const std::vector<dmuon::step::FingerprintPiece>&, const Buffer&) override {}
  OwnedBuffer make_gate(const Buffer&) override { return allocate(DType::kInt32, 1); }
  void prepare_pieces(const std::vector<dmuon::step::PreparePiece>&, const Buffer&) override {}
  int64_t ns_workspace_bytes(int64_t rows, int64_t cols, int64_t count, DType, dmuon::ns::Algorithm) const override {
    return static_cast<int64_t>(gram_workspace_bytes(rows, cols, count)) + 4 * count * (1 + chunks(rows * cols));
  }
  void orthogonalize(const dmuon::step::NsBatchDesc& batch,
                     const std::function<void(const dmuon::step::NsView&, bool first)>& fill,
                     const std::function<void(const dmuon::step::NsView&)>& consume) override {
    const StreamWorkspaces::Lease ws =
        workspaces_.take(current_stream(), gram_workspace_bytes(batch.rows, batch.cols, batch.count), batch.graphs);
    const int64_t ld = padded_ld(std::max(batch.rows, batch.cols));
    const dmuon::step::NsView view{ws.data(), DType::kFloat16, ld, std::min(batch.rows, batch.cols) * ld,
                                   batch.rows > batch.cols};
    fill(view, true);
    consume(view);
  }
  // NOTE: the CUDA ops' scales of the batch (freed at once, in stream order).
  void prepare_to_iterate(const std::vector<dmuon::step::LocalMatrix>&, const dmuon::step::Partials&,
                          const dmuon::step::NsBatchDesc& batch, const dmuon::step::NsView&, bool,
                          const Buffer&) override {
    allocate(DType::kFloat32, batch.count);
  }
  void iterate_from_pieces(const std::vector<dmuon::step::WirePiece>&, const dmuon::step::NsBatchDesc&,
                           const dmuon::step::NsView&, const Buffer&) override {
    ADD_FAILURE() << "one process assembles no pieces";
  }
  void result_to_pieces(const dmuon::step::NsView&, const dmuon::step::NsBatchDesc&,
                        const std::vector<dmuon::step::WirePiece>&) override {}
  void apply_result(const dmuon::step::NsView&, const dmuon::step::NsBatchDesc&,
                    const std::vector<dmuon::step::ApplyPiece>&, const Buffer&, const Buffer&) override {}
  void apply_pieces(const std::vector<dmuon::step::ApplyPiece>&, const Buffer&, const Buffer&) override {}
  std::vector<int32_t> read_flags(const std::vector<Buffer>& buffers) override {
    int64_t total = 0;
    for (const Buffer& b : buffers) total += b.numel;
    return std::vector<int32_t>(static_cast<size_t>(total), 0);
  }
  void synchronize() override {}
  int run_on_streams(const std::vector<int>& stream_of, const std::function<void(size_t)>& run) override {
    const int num_streams = stream_of.empty() ? 1 : 1 + *std::max_element(stream_of.begin(), stream_of.end());
    max_streams_ = std::max(max_streams_, num_streams);
    for (size_t k = 0; k < stream_of.size(); ++k) {
      stream_ = stream_of[k];
      run(k);
    }
    stream_ = 0;
    return num_streams;
  }

 private:
  static int64_t chunks(int64_t numel) { return std::max<int64_t>(1, (numel + 16383) / 16384); }
  void* current_stream() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(stream_ + 1)); }

  CountingAllocator& allocator_;
  StreamWorkspaces workspaces_;
  int stream_ = 0;
  int max_streams_ = 1;
};

struct Shape {
  int64_t rows, cols, count;
};

// Qwen2.5-1.5B's Muon matrices (hidden 1536, intermediate 8960, 28 layers, 2 KV heads of
// 128), in the order of its parameters: q of every layer, k and v, o, gate and up, down.
const std::vector<Shape> kQwen15 = {{1536, 1536, 28}, {256, 1536, 56}, {1536, 1536, 28}, {8960, 1536, 56},
                                    {1536, 8960, 28}};

// The largest NS batch of `shapes` under the engine's default bound of 2 GiB of workspace
// a batch (at least one matrix): the most matrices of one shape whose workspace fits it.
size_t largest_batch_workspace(const std::vector<Shape>& shapes, size_t limit) {
  std::map<std::pair<int64_t, int64_t>, int64_t> counts;
  for (const Shape& s : shapes) counts[{s.rows, s.cols}] += s.count;
  size_t largest = 0;
  for (const auto& [shape, count] : counts) {
    int64_t n = 1;
    while (n < count && gram_workspace_bytes(shape.first, shape.second, n + 1) <= limit) ++n;
    largest = std::max(largest, gram_workspace_bytes(shape.first, shape.second, n));
  }
  return largest;
}

// The one-process step over Qwen2.5-1.5B's 196 Muon matrices (float32, as bench ns makes
// them), 2 streams and CUDA graphs (the engine's defaults): every stream keeps one NS
// workspace, the size of its largest batch, so at the peak the step holds at most one
// largest batch per stream besides its small buffers (flags, partial sums, scales: under
// 1 MiB). NOTE: a workspace kept per stream and batch size (the graph cache before) held
// 7.63 GiB here, as bench ns measured on an H100 (12.52 GiB less 4.88 of momentum); one per
// stream holds 3.51. The parameters, gradients and momentum are the caller's, at
// addresses never touched.
TEST(StepMemory, OneProcessStepHoldsOneNsWorkspacePerStream) {
  std::vector<dmuon::step::ParamSpec> specs;
  std::vector<dmuon::step::ParamTensors> tensors;
  uintptr_t next = uintptr_t{1} << 52;
  auto fake = [&](int64_t numel) {
    const Buffer b{reinterpret_cast<void*>(next), DType::kFloat32, numel, {dmuon::step::DeviceKind::kCuda, 0}};
    next += static_cast<uintptr_t>(numel) * 4 + 4096;
    return b;
  };
  for (const Shape& s : kQwen15)
    for (int64_t k = 0; k < s.count; ++k) {
      dmuon::step::ParamSpec spec;
      spec.name = "m" + std::to_string(specs.size());
      spec.layout.global_shape = {s.rows, s.cols};
      specs.push_back(spec);
      tensors.push_back({fake(s.rows * s.cols), fake(s.rows * s.cols), fake(s.rows * s.cols), true, {}});
    }
  ASSERT_EQ(specs.size(), 196u);
  CountingAllocator allocator;
  size_t peak = 0;
  int max_streams = 0;
  {
    CountingOps ops(allocator);
    dmuon::testing::NoDataTransport transport(0, 1);
    dmuon::step::StepEngine engine(transport, ops, specs, dmuon::step::EngineOptions{});
    const std::vector<dmuon::step::GroupRule> rules{dmuon::testing::gram_rule(0.02, 0.0)};
    // NOTE: the first step runs every batch on the ops' stream (it tunes), later ones spread.
    for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(engine.step(tensors, rules, step).applied());
    peak = allocator.peak_bytes();
    max_streams = ops.max_streams();
  }
  ASSERT_EQ(max_streams, 2) << "the batches spread over the engine's 2 streams";
  const size_t bound = 2 * largest_batch_workspace(kQwen15, size_t{2048} * kMiB) + kMiB;
  EXPECT_LE(peak, bound) << "peak " << peak / kMiB << " MiB, bound " << bound / kMiB << " MiB";
  EXPECT_EQ(allocator.live_bytes(), 0u) << "everything released with the ops";
  EXPECT_EQ(allocator.num_bad_releases(), 0);
}

// A stream's workspace serves every smaller run; a larger one grows it (a new generation,
// the old memory released); streams keep their own; past the budget, or without graphs, a
// run gets memory of its own, released with its lease.
TEST(StepMemory, StreamWorkspacesGrowPerStreamWithinTheBudget) {
  CountingAllocator allocator;
  void* const s1 = reinterpret_cast<void*>(uintptr_t{1});
  void* const s2 = reinterpret_cast<void*>(uintptr_t{2});
  {
    StreamWorkspaces ws(allocator, 10 * kMiB);
    uint64_t first = 0;
    {
      const StreamWorkspaces::Lease a = ws.take(s1, 4 * kMiB, true);
      ASSERT_TRUE(a.kept());
      first = a.generation();
      EXPECT_NE(first, 0u);
    }
    EXPECT_EQ(allocator.live_bytes(), 4 * kMiB) << "kept after its run";
    EXPECT_EQ(ws.take(s1, 3 * kMiB, true).generation(), first) << "a smaller run reuses it";
    EXPECT_EQ(allocator.live_bytes(), 4 * kMiB);
    const uint64_t grown = ws.take(s1, 6 * kMiB, true).generation();
    EXPECT_NE(grown, first);
    EXPECT_EQ(allocator.live_bytes(), 6 * kMiB) << "the smaller workspace released when it grew";
    EXPECT_EQ(allocator.peak_bytes(), 6 * kMiB);
    EXPECT_TRUE(ws.take(s2, 4 * kMiB, true).kept()) << "6 + 4 MiB fit 10";
    EXPECT_EQ(ws.kept_bytes(), 10 * kMiB);
    {
      const StreamWorkspaces::Lease over = ws.take(s2, 5 * kMiB, true);
      EXPECT_FALSE(over.kept()) << "6 + 5 MiB pass the budget";
      EXPECT_EQ(over.generation(), 0u);
      EXPECT_EQ(allocator.live_bytes(), 15 * kMiB);
      const StreamWorkspaces::Lease eager = ws.take(s1, kMiB, false);
      EXPECT_FALSE(eager.kept()) << "without graphs";
    }
    EXPECT_EQ(allocator.live_bytes(), 10 * kMiB) << "own memory released with its lease";
    EXPECT_EQ(ws.take(s1, 6 * kMiB, true).generation(), grown);
  }
  EXPECT_EQ(allocator.live_bytes(), 0u);
  EXPECT_EQ(allocator.num_bad_releases(), 0);
}

}  // namespace
