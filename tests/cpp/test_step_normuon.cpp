// NorMuon through the step engine (CPU ops, one process): two steps of a plain matrix, a
// tall one and a 3-D stack against an fp64 Muon + NorMuon written here from the rule
// (optim/normuon.h); the state v updated in place; sharded and replicated matrices at
// worlds 2 and 3 (v rows moved to the owner and back) against one process, bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "ns/cpu/cpu_backend.h"
#include "optim/normuon.h"
#include "step/cpu/cpu_ops.h"
#include "step/engine.h"
#include "loopback_transport.h"
#include "step_world.h"

namespace {

using namespace dmuon;
using step::Buffer;
using step::DType;

struct Mat {
  std::vector<int64_t> shape;  // [rows, cols] or [E, rows, cols]
  int64_t batch_dims = 0;
};

step::ParamSpec spec_of(const std::string& name, const Mat& m, bool sharded) {
  step::ParamSpec s;
  s.name = name;
  s.layout.global_shape = m.shape;
  s.layout.batch_dims = m.batch_dims;
  s.layout.sharded = sharded;
  return s;
}

Buffer view(std::vector<float>& v) { return Buffer{v.data(), DType::kFloat32, static_cast<int64_t>(v.size()), {}}; }

// fp64 Muon with NorMuon on one parameter (every matrix of it), one step.
void reference_step(const Mat& m, std::vector<double>& p, std::vector<double>& buf, std::vector<double>& v,
                    const std::vector<double>& g, const step::GroupRule& rule) {
  const int64_t count = m.batch_dims ? m.shape[0] : 1, rows = m.shape[m.batch_dims], cols = m.shape[m.batch_dims + 1];
  std::vector<double> u(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    buf[i] += (1.0 - rule.momentum) * (g[i] - buf[i]);
    u[i] = rule.nesterov ? g[i] + rule.momentum * (buf[i] - g[i]) : buf[i];
  }
  ns::orthogonalize_cpu<double>(rule.schedule, u.data(), count, rows, cols);
  for (int64_t k = 0; k < count; ++k) {
    double* o = u.data() + k * rows * cols;
    std::vector<double> row_sq(rows, 0.0);
    double norm_sq = 0.0, hat_sq = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) row_sq[i] += o[i * cols + j] * o[i * cols + j];
      norm_sq += row_sq[i];
      double& vi = v[k * rows + i];
      vi = rule.normuon.beta2 * vi + (1.0 - rule.normuon.beta2) * row_sq[i] / static_cast<double>(cols);
      hat_sq += row_sq[i] / std::pow(std::sqrt(vi) + rule.normuon.eps, 2);
    }
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        o[i * cols + j] *= std::sqrt(norm_sq / hat_sq) / (std::sqrt(v[k * rows + i]) + rule.normuon.eps);
  }
  const double scale = rule.update_scale(rows, cols);
  for (size_t i = 0; i < p.size(); ++i) p[i] = p[i] * rule.decay() + scale * u[i];
}

TEST(StepNormuon, OneProcessMatchesFp64Reference) {
  const std::vector<Mat> mats = {{{6, 10}, 0}, {{12, 5}, 0}, {{3, 4, 7}, 1}};
  step::GroupRule rule = dmuon::testing::gram_rule(0.02, 0.1, true, "match_rms_adamw");
  rule.normuon = optim::NormuonRule{true, 0.9, 1e-8};
  std::mt19937 gen(11);
  std::normal_distribution<double> normal;
  std::vector<step::ParamSpec> specs;
  std::vector<std::vector<float>> p, g, buf, v;
  std::vector<std::vector<double>> rp, rbuf, rv;
  for (size_t i = 0; i < mats.size(); ++i) {
    specs.push_back(spec_of("w" + std::to_string(i), mats[i], false));
    int64_t numel = 1;
    for (int64_t d : mats[i].shape) numel *= d;
    const int64_t rows = numel / mats[i].shape.back();
    p.emplace_back(numel);
    buf.emplace_back(numel, 0.0f);
    g.emplace_back(numel);
    v.emplace_back(rows, 0.0f);
    for (auto& x : p.back()) x = static_cast<float>(normal(gen) * 0.1);
    rp.emplace_back(p.back().begin(), p.back().end());
    rbuf.emplace_back(numel, 0.0);
    rv.emplace_back(rows, 0.0);
  }
  dmuon::testing::LoopbackWorld world(1);
  step::CpuOpsOptions o;
  o.poison_allocations = true;
  step::CpuOps ops(o);
  step::StepEngine engine(world.transport(0), ops, specs, step::EngineOptions{});
  for (int s = 1; s <= 2; ++s) {
    std::vector<step::ParamTensors> tensors;
    for (size_t i = 0; i < mats.size(); ++i) {
      for (auto& x : g[i]) x = static_cast<float>(normal(gen));
      std::vector<double> gd(g[i].begin(), g[i].end());
      reference_step(mats[i], rp[i], rbuf[i], rv[i], gd, rule);
      step::ParamTensors t{view(p[i]), view(g[i]), view(buf[i]), true};
      t.row_state = view(v[i]);
      tensors.push_back(t);
    }
    const step::StepOutcome out = engine.step(tensors, {rule}, s);
    ASSERT_TRUE(out.applied()) << out.message;
  }
  // NOTE: float32 NS against fp64: the C++ tests' bound of 5e-4 relative per NS output;
  // NorMuon's per-row factors amplify it little (v is an average of O²).
  for (size_t i = 0; i < mats.size(); ++i) {
    std::vector<double> got(p[i].begin(), p[i].end()), gv(v[i].begin(), v[i].end());
    EXPECT_LT(dmuon::testing::relative_error(got, rp[i]), 1e-4) << specs[i].name;
    EXPECT_LT(dmuon::testing::relative_error(gv, rv[i]), 2e-3) << specs[i].name << " v";
  }
}

// Two steps at world 1, then at world 2 and 3 with one matrix sharded by rows (uneven at
// 3) and one replicated: every rank's parameter rows and v rows are the one-process ones.
// NOTE: the CPU wire is float32 and the owner's iterate sums the same values: the worlds
// agree to float32 rounding of the norm's summation order (1e-6 relative).
TEST(StepNormuon, ShardedAndReplicatedMatchOneProcessBitwise) {
  step::GroupRule rule = dmuon::testing::gram_rule(0.02, 0.05, true, "match_rms_adamw");
  rule.normuon = optim::NormuonRule{true, 0.9, 1e-8};
  const std::vector<Mat> mats = {{{8, 6}, 0}, {{5, 9}, 0}};
  const std::vector<bool> sharded = {true, false};
  std::mt19937 gen(5);
  std::normal_distribution<double> normal;
  std::vector<std::vector<float>> p0, g1, g2;
  for (const Mat& m : mats) {
    const int64_t numel = m.shape[0] * m.shape[1];
    p0.emplace_back(numel);
    g1.emplace_back(numel);
    g2.emplace_back(numel);
    for (auto* v : {&p0.back(), &g1.back(), &g2.back()})
      for (auto& x : *v) x = static_cast<float>(normal(gen));
  }
  // Run at `world`: rank r holds torch.chunk rows of the sharded matrix, all of the other.
  auto run = [&](int world) {
    std::vector<std::vector<std::vector<float>>> p(world), v(world);  // [rank][param]
    std::vector<std::vector<int64_t>> row0(world);
    dmuon::testing::LoopbackWorld loop(world);
    const auto errors = loop.run([&](int rank) {
      std::vector<step::ParamSpec> specs;
      for (size_t i = 0; i < mats.size(); ++i) specs.push_back(spec_of("w" + std::to_string(i), mats[i], sharded[i]));
      step::CpuOps ops;
      step::StepEngine engine(loop.transport(rank), ops, specs, step::EngineOptions{});
      std::vector<std::vector<float>> buf(mats.size()), g(mats.size());
      p[rank].resize(mats.size());
      v[rank].resize(mats.size());
      row0[rank].resize(mats.size());
      for (size_t i = 0; i < mats.size(); ++i) {
        const layout::RowBlock rows = engine.items().local_rows(static_cast<int>(i), rank);
        const int64_t cols = mats[i].shape[1];
        row0[rank][i] = rows.begin;
        p[rank][i].assign(p0[i].begin() + rows.begin * cols, p0[i].begin() + (rows.begin + rows.count) * cols);
        buf[i].assign(p[rank][i].size(), 0.0f);
        v[rank][i].assign(rows.count, 0.0f);
      }
      for (int s = 1; s <= 2; ++s) {
        std::vector<step::ParamTensors> tensors;
        for (size_t i = 0; i < mats.size(); ++i) {
          const int64_t cols = mats[i].shape[1];
          const std::vector<float>& src = s == 1 ? g1[i] : g2[i];
          g[i].assign(src.begin() + row0[rank][i] * cols, src.begin() + row0[rank][i] * cols + p[rank][i].size());
          step::ParamTensors t{view(p[rank][i]), view(g[i]), view(buf[i]), true};
          t.row_state = view(v[rank][i]);
          tensors.push_back(t);
        }
        const step::StepOutcome out = engine.step(tensors, {rule}, s);
        DMUON_CHECK(out.applied(), out.message);
      }
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    return std::make_tuple(p, v, row0);
  };
  const auto [p1, v1, r1] = run(1);
  for (int world : {2, 3}) {
    const auto [pw, vw, rw] = run(world);
    for (int rank = 0; rank < world; ++rank)
      for (size_t i = 0; i < mats.size(); ++i) {
        const int64_t cols = mats[i].shape[1], r0 = rw[rank][i];
        // NOTE: bitwise: the owner holds the same fp32 U whatever the sharding (the wire is
        // fp32 on the CPU), NS normalizes the whole matrix in double in one order, and v
        // comes back unchanged; a cross-world difference of a training run comes from its
        // gradients (FSDP2's mean over 3 ranks is not exact), not from the step.
        for (size_t k = 0; k < pw[rank][i].size(); ++k)
          EXPECT_EQ(pw[rank][i][k], p1[0][i][r0 * cols + k])
              << "world " << world << " rank " << rank << " w" << i << " element " << k;
        for (size_t k = 0; k < vw[rank][i].size(); ++k)
          EXPECT_EQ(vw[rank][i][k], v1[0][i][r0 + k]) << "world " << world << " rank " << rank << " w" << i << " v row " << k;
        EXPECT_FALSE(vw[rank][i].empty() && pw[rank][i].size() > 0);
      }
  }
}

}  // namespace
