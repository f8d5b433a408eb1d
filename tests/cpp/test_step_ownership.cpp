// The weight-ownership mode's exchange (step/ownership_exchange.h) on loopback worlds of
// 1–4 ranks and a 2×2 mesh (each axis a loopback world of its own): bucket layouts, the
// reduction to owners against an fp64 mean, gradient accumulation windows, missing
// gradients, publishes, and finished buckets handed to the step engine's early work,
// whose steps match fp64 Muon.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "step/ownership_exchange.h"
#include "step_world.h"

namespace {

using dmuon::step::Buffer;
using dmuon::step::CpuOps;
using dmuon::step::DType;
using dmuon::step::ExchangeTransports;
using dmuon::testing::LoopbackWorld;
using dmuon::step::OwnedBucket;
using dmuon::step::OwnedParam;
using dmuon::step::OwnershipExchange;
using dmuon::step::OwnershipMesh;
using dmuon::testing::HostTensor;
using dmuon::testing::contains;

// A replicas × shards mesh of loopback worlds: the whole world, each row, and each column
// twice (publishes; the reduction's second level). Rank r sits at (r / shards, r % shards).
struct MeshWorlds {
  int replicas, shards;
  LoopbackWorld world;
  std::vector<std::unique_ptr<LoopbackWorld>> rows, columns, column_reduces;

  MeshWorlds(int num_replicas, int num_shards)
      : replicas(num_replicas), shards(num_shards), world(num_replicas * num_shards) {
    for (int q = 0; q < replicas && shards > 1; ++q) rows.push_back(std::make_unique<LoopbackWorld>(shards));
    for (int s = 0; s < shards && replicas > 1; ++s) {
      columns.push_back(std::make_unique<LoopbackWorld>(replicas));
      column_reduces.push_back(std::make_unique<LoopbackWorld>(replicas));
    }
  }
  OwnershipMesh mesh() const {
    OwnershipMesh m{shards, replicas, {}, {}};
    for (int r = 0; r < replicas * shards; ++r) {
      m.shard_of.push_back(r % shards);
      m.replica_of.push_back(r / shards);
    }
    return m;
  }
  ExchangeTransports transports(int r) {
    const int q = r / shards, s = r % shards;
    ExchangeTransports t;
    if (shards > 1) t.row = &rows[static_cast<size_t>(q)]->transport(s);
    if (replicas > 1) {
      t.column = &columns[static_cast<size_t>(s)]->transport(q);
      t.column_reduce = &column_reduces[static_cast<size_t>(s)]->transport(q);
    }
    return t;
  }
  // fn(rank) on every rank; a rank that throws fails every axis' collectives too.
  std::vector<std::string> run(const std::function<void(int)>& fn) {
    return world.run([&](int r) {
      try {
        fn(r);
      } catch (const std::exception& error) {
        for (auto* axis : {&rows, &columns, &column_reduces})
          for (auto& w : *axis) w->abort(r, error.what());
        throw;
      }
    });
  }
};

// Parameters of several sizes (one empty), dtypes and owners, so that buckets are uneven.
std::vector<OwnedParam> params_of(int world) {
  std::vector<OwnedParam> params = {{"a", 12, DType::kFloat32, 0}, {"b", 30, DType::kFloat32, 0},
                                    {"c", 7, DType::kBFloat16, 0}, {"d", 0, DType::kFloat32, 0},
                                    {"e", 64, DType::kFloat64, 0}, {"f", 5, DType::kFloat32, 0},
                                    {"g", 20, DType::kFloat32, 0}};
  for (size_t p = 0; p < params.size(); ++p) params[p].owner = static_cast<int>((3 * p + 1) % static_cast<size_t>(world));
  return params;
}

// Rank r's gradient of parameter p in micro-batch m (values exact in every dtype here).
std::vector<double> grad_values(int r, size_t p, int m, int64_t numel) {
  std::mt19937_64 rng(1000 * static_cast<uint64_t>(r) + 10 * p + static_cast<uint64_t>(m));
  std::uniform_int_distribution<int> pick(-64, 64);
  std::vector<double> v(static_cast<size_t>(numel));
  for (double& x : v) x = pick(rng) / 16.0;
  return v;
}

struct Reduced {
  std::vector<std::vector<double>> grads;  // [param] the owner's reduced gradient (empty elsewhere)
  std::vector<std::vector<int>> finished;  // [bucket] this rank's parameters on_final gave
};

// One window on every rank of a replicas × shards mesh: `micro` micro-batches (the last one
// synced), parameters in reverse order, a poll after each; skip(r, p): no gradient there.
std::vector<Reduced> reduce_window(int replicas, int shards, const std::vector<OwnedParam>& params, int micro,
                                   DType reduce_dtype, int64_t bucket_bytes,
                                   const std::function<bool(int, size_t)>& skip = nullptr) {
  MeshWorlds worlds(replicas, shards);
  const int world = replicas * shards;
  std::vector<Reduced> out(static_cast<size_t>(world));
  const auto errors = worlds.run([&](int r) {
    CpuOps ops;
    OwnershipExchange exchange(params, worlds.mesh(), r, worlds.transports(r), ops, ops,
                               {bucket_bytes, reduce_dtype, 1});
    Reduced& mine = out[static_cast<size_t>(r)];
    mine.finished.resize(exchange.buckets().size());
    const auto collect = [&](int bucket, const std::vector<int>& finished) {
      mine.finished[static_cast<size_t>(bucket)] = finished;
    };
    for (int m = 0; m < micro; ++m) {
      const bool sync = m == micro - 1;
      for (size_t p = params.size(); p-- > 0;) {
        if (skip && skip(r, p)) continue;
        const HostTensor grad(grad_values(r, p, m, params[p].numel), params[p].dtype);
        exchange.grad_ready(static_cast<int>(p), grad.buffer(), Buffer{}, sync);
        exchange.progress(false, collect);
      }
      exchange.end_backward(sync);
    }
    exchange.progress(true, collect);
    for (size_t p = 0; p < params.size(); ++p) {
      const Buffer g = exchange.reduced_grad(static_cast<int>(p));
      HostTensor copy(std::vector<double>(static_cast<size_t>(g.numel), 0.0), g.dtype);
      if (g.numel > 0) ops.copy({{g, copy.buffer()}});
      mine.grads.push_back(copy.values());
    }
    exchange.end_window(1);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return out;
}

// The owner of each parameter holds the mean over ranks of its micro-batches' sum, in the
// parameter's dtype; no other rank holds anything of it.
void expect_means(const std::vector<Reduced>& out, const std::vector<OwnedParam>& params, int micro, double tolerance,
                  const std::function<bool(int, size_t)>& skip = nullptr) {
  const int world = static_cast<int>(out.size());
  for (size_t p = 0; p < params.size(); ++p) {
    std::vector<double> mean(static_cast<size_t>(params[p].numel), 0.0);
    bool any = false;
    for (int r = 0; r < world; ++r) {
      if (skip && skip(r, p)) continue;
      any = true;
      for (int m = 0; m < micro; ++m) {
        const auto g = dmuon::testing::rounded(grad_values(r, p, m, params[p].numel), params[p].dtype);
        for (size_t i = 0; i < mean.size(); ++i) mean[i] += g[i] / world;
      }
    }
    for (int r = 0; r < world; ++r) {
      const auto& got = out[static_cast<size_t>(r)].grads[p];
      const bool holds = r == params[p].owner && params[p].numel > 0 && any && !(skip && skip(r, p));
      if (!holds) {
        EXPECT_TRUE(got.empty()) << params[p].name << " on rank " << r;
        continue;
      }
      ASSERT_EQ(got.size(), mean.size()) << params[p].name;
      for (size_t i = 0; i < mean.size(); ++i)
        EXPECT_NEAR(got[i], mean[i], tolerance * (1.0 + std::abs(mean[i]))) << params[p].name << "[" << i << "]";
    }
  }
}

// ---------------------------------------------------------------- bucket layout
TEST(OwnedBuckets, RunsInGradientOrderOrderedByOwnerWithBothLevelsCounts) {
  const OwnershipMesh mesh{2, 2, {0, 1, 0, 1}, {0, 0, 1, 1}};
  // Parameters 0..5 of 10, 20, … elements (40–240 bytes), owners 3, 0, 2, 1, 3, 0, in
  // backward order; a bucket closes once it holds 400 bytes: {5, 4}, then {3, 2, 1, 0}.
  const std::vector<int64_t> numel = {10, 20, 30, 40, 50, 60};
  const std::vector<int> owners = {3, 0, 2, 1, 3, 0};
  const auto buckets = dmuon::step::plan_owned_buckets({5, 4, 3, 2, 1, 0}, numel, owners, mesh, 400, 4);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].params, (std::vector<int>{5, 4}));
  EXPECT_EQ(buckets[0].shard_counts, (std::vector<int64_t>{60, 50}));
  const OwnedBucket& last = buckets.back();
  // {3, 2, 1, 0} by (owner's shard, owner's replica): 1 (0,0), 2 (s0,r1), 3 (s1,r0), 0 (s1,r1).
  EXPECT_EQ(last.params, (std::vector<int>{1, 2, 3, 0}));
  EXPECT_EQ(last.offset, (std::vector<int64_t>{0, 20, 50, 90}));
  EXPECT_EQ(last.numel, 100);
  EXPECT_EQ(last.shard_counts, (std::vector<int64_t>{50, 50}));
  EXPECT_EQ(last.replica_counts, (std::vector<std::vector<int64_t>>{{20, 30}, {40, 10}}));
  EXPECT_EQ(last.final_offset, (std::vector<int64_t>{0, 0, 0, 0}));
  // Bad input is named.
  const auto error = dmuon::testing::error_of(
      [&] { dmuon::step::plan_owned_buckets({0, 0}, {1, 1}, {0, 0}, OwnershipMesh::flat(1), 0, 4); });
  EXPECT_TRUE(contains(error, "order lists parameter 0 twice")) << error;
  const auto outside = dmuon::testing::error_of(
      [&] { dmuon::step::plan_owned_buckets({0}, {1}, {2}, OwnershipMesh::flat(2), 0, 4); });
  EXPECT_TRUE(contains(outside, "the owner of parameter 0 is 2, outside the 2 ranks")) << outside;
  const auto bad_mesh = dmuon::testing::error_of([&] { OwnershipMesh{2, 1, {0, 0}, {0, 0}}.validate(); });
  EXPECT_TRUE(contains(bad_mesh, "two ranks at (0, 0)")) << bad_mesh;
}

// ---------------------------------------------------------------- reduction to owners
TEST(OwnershipExchange, OwnersHoldTheMeanOverRanksAtWorldsOneToFour) {
  for (int world : {1, 2, 3, 4}) {
    const auto params = params_of(world);
    // NOTE: 100-byte buckets hold 1–3 parameters of float32: uneven buckets, some of one.
    const auto out = reduce_window(1, world, params, 1, DType::kFloat32, 100);
    // NOTE: float32 sums of values exact in bfloat16 (multiples of 1/16): exact but for
    // the division by the world size (3) and bfloat16's rounding of the mean.
    expect_means(out, params, 1, world == 3 ? 4e-3 : 1e-6);
    for (int r = 0; r < world; ++r)
      for (const std::vector<int>& finished : out[static_cast<size_t>(r)].finished)
        for (int p : finished) EXPECT_EQ(params[static_cast<size_t>(p)].owner, r) << "world " << world;
  }
}

TEST(OwnershipExchange, ATwoByTwoMeshReducesInRowsThenColumns) {
  const auto params = params_of(4);
  for (const DType reduce : {DType::kFloat32, DType::kBFloat16}) {
    const auto out = reduce_window(2, 2, params, 1, reduce, 64);
    // NOTE: a bfloat16 wire rounds the row's partial sums to 8 bits.
    expect_means(out, params, 1, reduce == DType::kFloat32 ? 4e-3 : 2e-2);
  }
}

TEST(OwnershipExchange, AccumulationWindowsReduceTheSumOnce) {
  for (int world : {2, 3}) {
    const auto params = params_of(world);
    const auto out = reduce_window(1, world, params, 3, DType::kFloat32, 100);
    expect_means(out, params, 3, 4e-3);
  }
  const auto params = params_of(4);
  expect_means(reduce_window(2, 2, params, 2, DType::kFloat32, 0), params, 2, 4e-3);
}

// A parameter without a gradient anywhere is handed to no one; one missing on one rank
// counts as zeros there (its owner, when it has one, holds the sum of the others / world).
TEST(OwnershipExchange, MissingGradientsCountAsZeros) {
  const auto params = params_of(3);
  const auto skip = [](int r, size_t p) { return p == 5 || (p == 1 && r == 2) || (p == 6 && r == params_of(3)[6].owner); };
  const auto out = reduce_window(1, 3, params, 1, DType::kFloat32, 100, skip);
  expect_means(out, params, 1, 4e-3, skip);
  for (int r = 0; r < 3; ++r)
    for (const std::vector<int>& finished : out[static_cast<size_t>(r)].finished)
      for (int p : finished) EXPECT_TRUE(p != 5 && !(p == 6)) << "parameter " << p << " on rank " << r;
}

TEST(OwnershipExchange, AGradientAfterItsBucketLeftIsNamed) {
  LoopbackWorld world(1);
  const auto errors = world.run([&](int r) {
    CpuOps ops;
    OwnershipExchange exchange({{"w", 4, DType::kFloat32, 0}}, OwnershipMesh::flat(1), r, {}, ops, ops, {});
    const HostTensor grad(std::vector<double>(4, 1.0), DType::kFloat32);
    exchange.grad_ready(0, grad.buffer(), Buffer{}, true);
    exchange.grad_ready(0, grad.buffer(), Buffer{}, true);
  });
  EXPECT_TRUE(contains(errors[0], "the gradient of 'w' arrived after its bucket was reduced")) << errors[0];
}

// ---------------------------------------------------------------- publish
TEST(OwnershipExchange, PublishGivesEveryRankTheOwnersWeight) {
  for (const auto& [replicas, shards] : {std::pair{1, 3}, std::pair{2, 2}}) {
    MeshWorlds worlds(replicas, shards);
    const int world = replicas * shards;
    const auto params = params_of(world);
    std::vector<std::vector<std::vector<double>>> got(static_cast<size_t>(world));
    const auto errors = worlds.run([&](int r) {
      CpuOps ops;
      OwnershipExchange exchange(params, worlds.mesh(), r, worlds.transports(r), ops, ops, {});
      for (size_t p = 0; p < params.size(); ++p) {
        const double mine = params[p].owner == r ? 7.0 + static_cast<double>(p) : -1.0;
        HostTensor weight(std::vector<double>(static_cast<size_t>(params[p].numel), mine), params[p].dtype);
        auto pending = exchange.publish(static_cast<int>(p), weight.buffer(), "publish " + params[p].name);
        if (pending) pending->wait();
        got[static_cast<size_t>(r)].push_back(weight.values());
      }
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "");
      for (size_t p = 0; p < params.size(); ++p)
        EXPECT_EQ(got[static_cast<size_t>(r)][p], std::vector<double>(static_cast<size_t>(params[p].numel), 7.0 + p))
            << params[p].name << " on rank " << r << " of " << replicas << "x" << shards;
    }
  }
}

// ---------------------------------------------------------------- the engine's early work
// Owned matrices on worlds of 1 and 2 and a 2×2 mesh: buckets reduced in backward and handed
// to the engine's begun step, every owned matrix's NS early; two steps bit for bit those of
// the engine alone fed the step's gradients (rank r holds world × the gradient's elements
// i ≡ r mod world, zeros elsewhere: their mean is the gradient, exactly, at these worlds).
TEST(OwnershipExchange, FinishedBucketsStepOnTheEngineAsTheEngineAlone) {
  using dmuon::testing::ModelParam;
  constexpr int kSteps = 2;
  for (const auto& [replicas, shards] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    const int world_size = replicas * shards;
    std::vector<ModelParam> model = {
        {"q", {8, 8}, 0, false, DType::kFloat32, 0},   {"k", {8, 8}, 0, false, DType::kFloat32, 0},
        {"up", {12, 5}, 0, false, DType::kFloat32, 1}, {"down", {5, 12}, 0, false, DType::kFloat32, 1},
        {"experts", {3, 4, 6}, 1, false, DType::kFloat32, 0}, {"half", {6, 9}, 0, false, DType::kBFloat16, 0},
    };
    for (size_t p = 0; p < model.size(); ++p) model[p].whole_on_rank = static_cast<int>((2 * p + 1) % world_size);
    const dmuon::testing::World world(model, world_size, kSteps, 5);
    const std::vector<dmuon::step::GroupRule> rules = {dmuon::testing::gram_rule(0.3, 0.05, true, "original"),
                                                       dmuon::testing::standard_rule(0.2, 0.0, false)};
    const dmuon::testing::EngineRun alone = dmuon::testing::run_engine(world, {}, rules, kSteps);
    std::vector<OwnedParam> params;
    for (int p = 0; p < world.table().num_params(); ++p)
      params.push_back({model[static_cast<size_t>(p)].name, world.numel(p), model[static_cast<size_t>(p)].dtype,
                        model[static_cast<size_t>(p)].whole_on_rank});
    std::vector<dmuon::testing::RankTensors> tensors = world.locals();
    std::vector<int64_t> early(static_cast<size_t>(world_size)), owned_items(static_cast<size_t>(world_size));
    MeshWorlds worlds(replicas, shards);
    const auto errors = worlds.run([&](int r) {
      CpuOps ops;
      dmuon::step::StepEngine engine(worlds.world.transport(r), ops, world.specs(), {});
      OwnershipExchange exchange(params, worlds.mesh(), r, worlds.transports(r), ops, ops, {48, DType::kFloat32, 1});
      dmuon::testing::RankTensors& t = tensors[static_cast<size_t>(r)];
      const auto hand = [&](int, const std::vector<int>& finished) { exchange.hand_to(engine, 0, finished); };
      for (int s = 1; s <= kSteps; ++s) {
        engine.begin_step(rules, s);
        for (size_t p = params.size(); p-- > 0;) {
          std::vector<double> g = world.grads[static_cast<size_t>(s - 1)][p];
          for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<int>(i) % world_size == r ? world_size * g[i] : 0.0;
          const HostTensor grad(g, params[p].dtype);
          const Buffer momentum = params[p].owner == r ? t.momentum[p].buffer() : Buffer{};
          exchange.grad_ready(static_cast<int>(p), grad.buffer(), momentum, true);
          exchange.progress(false, hand);
        }
        exchange.end_backward(true);
        exchange.progress(true, hand);
        std::vector<dmuon::step::ParamTensors> views = t.views();
        for (size_t p = 0; p < params.size(); ++p) {
          views[p].has_grad = exchange.contributed(static_cast<int>(p));
          if (params[p].owner == r) views[p].grad = exchange.reduced_grad(static_cast<int>(p));
        }
        EXPECT_TRUE(engine.step(views, rules, s).applied());
        exchange.end_window(s);
      }
      early[static_cast<size_t>(r)] = engine.last_stats().early_orthogonalized;
      for (int i = 0; i < world.table().num_items(); ++i)
        owned_items[static_cast<size_t>(r)] += engine.owners()[static_cast<size_t>(i)] == r ? 1 : 0;
    });
    const std::string where = std::to_string(replicas) + "x" + std::to_string(shards);
    for (int r = 0; r < world_size; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r << ", " << where;
      EXPECT_EQ(early[static_cast<size_t>(r)], owned_items[static_cast<size_t>(r)]) << "rank " << r << ", " << where;
    }
    EXPECT_EQ(dmuon::testing::state_bytes(tensors), dmuon::testing::state_bytes(alone.tensors)) << where;
  }
}

// ---------------------------------------------------------------- the start agreement
struct Agreement {
  std::vector<std::string> errors;
  std::vector<dmuon::step::StartAgreed> agreed;
};

Agreement agree(int world_size, const std::function<void(int, dmuon::step::StartChecks&, dmuon::step::StartFacts&)>& set) {
  LoopbackWorld world(world_size);
  Agreement out;
  out.agreed.resize(static_cast<size_t>(world_size));
  out.errors = world.run([&](int r) {
    dmuon::step::StartChecks checks{42, "", {"Muon, 2 parameter(s), first 'a' (4, 4)"}, false};
    dmuon::step::StartFacts facts{{true, true, false}, -1, -1};
    set(r, checks, facts);
    out.agreed[static_cast<size_t>(r)] = dmuon::step::agree_start(
        world.transport(r), checks, facts, 5, [](int i) { return "parameter '" + std::string(1, 'a' + i) + "'"; });
  });
  return out;
}

TEST(StartAgreement, FirstBadAndStaleWorkAreAgreed) {
  const Agreement a = agree(3, [](int r, dmuon::step::StartChecks& c, dmuon::step::StartFacts& f) {
    if (r == 1) f.first_nonfinite = 2;
    if (r == 2) f.first_nonfinite = 1, f.first_corrupt = 0, c.changed = true;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(a.errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(a.agreed[static_cast<size_t>(r)].first_nonfinite, 1);
    EXPECT_EQ(a.agreed[static_cast<size_t>(r)].first_corrupt, 0);
    EXPECT_TRUE(a.agreed[static_cast<size_t>(r)].changed);
  }
}

TEST(StartAgreement, AFailedCheckIsRaisedEverywhereNamingItsRank) {
  const Agreement a = agree(3, [](int r, dmuon::step::StartChecks& c, dmuon::step::StartFacts&) {
    if (r == 1) c.error = "the state of 'w' is broken";
  });
  EXPECT_TRUE(contains(a.errors[1], "the state of 'w' is broken") && !contains(a.errors[1], "rank 1 failed"))
      << a.errors[1];
  for (int r : {0, 2})
    EXPECT_TRUE(contains(a.errors[static_cast<size_t>(r)], "dmuon step 5: rank 1 failed its checks before writing "
                                                           "anything, so no rank stepped: the state of 'w' is broken"))
        << a.errors[static_cast<size_t>(r)];
}

TEST(StartAgreement, StructuresThatDifferAreNamedWithEveryRanksView) {
  const Agreement added = agree(2, [](int r, dmuon::step::StartChecks& c, dmuon::step::StartFacts& f) {
    if (r == 0) c.signature = 43, c.describe.push_back("Muon, 1 parameter(s), first 'x' (8, 8)"), f.has_grad.push_back(true);
  });
  const Agreement changed = agree(2, [](int r, dmuon::step::StartChecks& c, dmuon::step::StartFacts&) {
    if (r == 1) c.signature = 44, c.describe[0] = "AdamW, 2 parameter(s), first 'a' (4, 4)";
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(added.errors[static_cast<size_t>(r)],
                         "param group 1 (Muon, 1 parameter(s), first 'x' (8, 8)) exists on rank(s) [0] but not on "
                         "rank(s) [1]; add_param_group"))
        << added.errors[static_cast<size_t>(r)];
    EXPECT_TRUE(contains(changed.errors[static_cast<size_t>(r)],
                         "param group 0 differs across ranks (rank 0: Muon, 2 parameter(s), first 'a' (4, 4); rank 1: "
                         "AdamW, 2 parameter(s), first 'a' (4, 4))"))
        << changed.errors[static_cast<size_t>(r)];
  }
}

TEST(StartAgreement, AGradientOnSomeRanksOnlyIsNamed) {
  const Agreement a = agree(3, [](int r, dmuon::step::StartChecks&, dmuon::step::StartFacts& f) {
    if (r == 0) f.has_grad[1] = false;
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(contains(a.errors[static_cast<size_t>(r)], "parameter 'b' has a gradient on 2 of 3 ranks at step 5; "
                                                           "every rank must have it or none"))
        << a.errors[static_cast<size_t>(r)];
}

}  // namespace
