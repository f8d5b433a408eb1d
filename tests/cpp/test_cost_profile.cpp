// The planner's NS costs measured by the engine (step/cost_profile.h): the median of the
// timed runs through the ops' marks or the host clock, the measurement store (read, written,
// a corrupt or stale one ignored with one warning), the batches the step's stages form, and
// the table shared from rank 0 (loopback world), measured by every rank alone where the
// transport moves no data, with a failure or mismatched options raised on every rank.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "autotune/tune_cache.h"
#include "error_of.h"
#include "step/cost_profile.h"
#include "step_world.h"

namespace {

using dmuon::step::CostOptions;
using dmuon::step::CostPoint;
using dmuon::step::DType;
using dmuon::step::EngineOptions;
using dmuon::testing::ModelParam;
using dmuon::testing::World;

std::string temp_path(const std::string& name) {
  static std::atomic<int> counter{0};
  return ::testing::TempDir() + "/dmuon_cost_profile_" + std::to_string(::getpid()) + "_" +
         std::to_string(counter++) + "_" + name;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// CPU ops whose runs "take" scripted times, read through device marks (the marks of the
// k-th timed run give script[k] seconds, then the script's last value); they count the NS
// batches they ran, and may fail them.
class ScriptedOps : public dmuon::testing::ForwardingOps {
 public:
  explicit ScriptedOps(std::vector<double> script) : ForwardingOps(cpu_), script_(std::move(script)) {}
  bool device_marks() const override { return true; }
  int64_t record_mark() override { return num_marks_++; }
  double mark_seconds(int64_t from, int64_t to) override {
    EXPECT_EQ(to, from + 1);
    const size_t k = std::min(num_timed_++, script_.size() - 1);
    return script_[k];
  }
  void clear_marks() override { num_marks_ = 0; }
  void orthogonalize(const dmuon::step::NsBatchDesc& batch,
                     const std::function<void(const dmuon::step::NsView&, bool)>& fill,
                     const std::function<void(const dmuon::step::NsView&)>& consume) override {
    DMUON_CHECK(!fail, "scripted failure of an NS batch");
    counts.push_back(batch.count);
    inner_.orthogonalize(batch, fill, consume);
  }
  std::vector<int64_t> counts;  // of every NS batch run
  bool fail = false;

 private:
  dmuon::step::CpuOps cpu_;
  std::vector<double> script_;
  size_t num_timed_ = 0;
  int64_t num_marks_ = 0;
};

// Collects the store's warnings for one test.
struct Warnings {
  std::vector<std::string> seen;
  Warnings() {
    dmuon::autotune::reset_warnings_for_testing();
    dmuon::autotune::TuneCache::set_warning_sink([this](const std::string& m) { seen.push_back(m); });
  }
  ~Warnings() { dmuon::autotune::TuneCache::set_warning_sink(nullptr); }
};

const dmuon::ns::Schedule& gram() {
  static const dmuon::ns::Schedule schedule = dmuon::testing::gram_rule(0.02, 0.0).schedule;
  return schedule;
}

CostOptions store_at(const std::string& path, int num_warmup, int num_runs) {
  CostOptions options;
  options.store_path = path;
  options.num_warmup = num_warmup;
  options.num_runs = num_runs;
  return options;
}

// Warm-up runs are discarded; the table holds the median of the timed ones.
TEST(CostProfile, TakesTheMedianOfTheTimedRunsAfterWarmup) {
  ScriptedOps ops({100.0, 5.0, 1.0, 3.0, 9.0, 2.0});
  const std::vector<CostPoint> points{{8, 12, 2, DType::kFloat32, &gram()}};
  const auto table = dmuon::step::measure_ns_costs(ops, points, DType::kFloat32, true, store_at(temp_path("m"), 1, 5));
  EXPECT_EQ(ops.counts, std::vector<int64_t>(6, 2));
  EXPECT_DOUBLE_EQ(table.seconds(8, 12, 2), 3.0);
}

// Ops without device marks are timed on the host clock around a synchronized run (the
// CPU ops: their passes run at once); every point gets a positive time.
TEST(CostProfile, OpsWithoutMarksAreTimedOnTheHostClock) {
  dmuon::step::CpuOps ops;
  const std::vector<CostPoint> points{{16, 40, 1, DType::kFloat32, &gram()}, {16, 40, 3, DType::kFloat32, &gram()},
                                      {40, 16, 2, DType::kBFloat16, &gram()}};
  const auto table = dmuon::step::measure_ns_costs(ops, points, DType::kFloat32, false, store_at(temp_path("h"), 0, 3));
  ASSERT_EQ(table.size(), 3u);
  for (const auto& [rows, cols, count, seconds] : table.entries()) EXPECT_GT(seconds, 0.0) << rows << "x" << cols;
  const std::string bad = dmuon::testing::error_of([&] {
    dmuon::step::measure_ns_costs(ops, {{16, 0, 1, DType::kFloat32, &gram()}}, DType::kFloat32, false, CostOptions{});
  });
  EXPECT_NE(bad.find("a batch of 1 16x0 matrices"), std::string::npos) << bad;
}

// The store: written once after timing (a valid autotune-format file under the ops'
// environment), read back by another process (here: the same file under a new path, which
// this process has not read), never trusted when corrupt or stale (one warning, re-timed,
// rewritten).
TEST(CostProfile, StoreIsWrittenReadAndABadOneIgnoredWithOneWarning) {
  const std::vector<CostPoint> points{{8, 12, 1, DType::kFloat32, &gram()}, {8, 12, 2, DType::kFloat32, &gram()}};
  const std::string first = temp_path("first.txt");
  ScriptedOps timed({0.25});
  const auto measured = dmuon::step::measure_ns_costs(timed, points, DType::kFloat32, true, store_at(first, 0, 1));
  const dmuon::autotune::TuneEnvironment environment = timed.measurement_store().environment;
  const std::string text = read_all(first);
  std::string why;
  const auto parsed = dmuon::autotune::parse_cache_text(text, environment, &why);
  ASSERT_TRUE(parsed.has_value()) << why;
  EXPECT_EQ(parsed->size(), 2u);
  EXPECT_NE(text.find("entry\tns_time\t8\t12\t0\t2\tfloat32\tgram:x5:"), std::string::npos) << text;

  // Read: no run, the stored times.
  const std::string copy = temp_path("copy.txt");
  { std::ofstream(copy, std::ios::binary) << text; }
  ScriptedOps unused({7.0});
  const auto loaded = dmuon::step::measure_ns_costs(unused, points, DType::kFloat32, true, store_at(copy, 0, 1));
  EXPECT_TRUE(unused.counts.empty());
  EXPECT_EQ(loaded.entries(), measured.entries());

  // Corrupt (cut) and stale (another dmuon version): one warning each, re-timed, rewritten valid.
  const std::string cut = temp_path("cut.txt"), stale = temp_path("stale.txt");
  { std::ofstream(cut, std::ios::binary) << text.substr(0, text.size() / 2); }
  dmuon::autotune::TuneEnvironment other = environment;
  other.dmuon_version = "0.0.1";
  dmuon::autotune::TuneCache old(other);
  old.put({"ns_time", 8, 12, 0, 1, "float32", "x"}, {"median", 1.0});
  old.save(stale);
  for (const std::string& path : {cut, stale}) {
    Warnings warnings;
    ScriptedOps again({0.5});
    const auto table = dmuon::step::measure_ns_costs(again, points, DType::kFloat32, true, store_at(path, 0, 1));
    EXPECT_EQ(again.counts, (std::vector<int64_t>{1, 2}));
    EXPECT_DOUBLE_EQ(table.seconds(8, 12, 2), 0.5);
    ASSERT_EQ(warnings.seen.size(), 1u) << path;
    EXPECT_NE(warnings.seen[0].find(path), std::string::npos) << warnings.seen[0];
    EXPECT_TRUE(dmuon::autotune::parse_cache_text(read_all(path), environment, nullptr).has_value()) << path;
  }
  for (const std::string& path : {first, copy, cut, stale}) {
    std::remove(path.c_str());
    std::remove((path + ".lock").c_str());
  }
}

// Eleven 6×10 matrices and a 10×4 one; the NS workspace bound lets a batch hold three
// 6×10 matrices (as make_stages cuts them).
std::vector<ModelParam> eleven_and_one() {
  return {{"stack", {11, 6, 10}, 1, true, DType::kFloat32, 0}, {"other", {10, 4}, 0, true, DType::kFloat32, 0}};
}

EngineOptions measuring(const std::string& store, int64_t ns_batch_bytes) {
  EngineOptions options;
  options.solver = dmuon::plan::SolverKind::kLpt;
  options.cost.measure = true;
  options.cost.schedules = {gram()};
  options.cost.store_path = store;
  options.cost.num_warmup = 0;
  options.cost.num_runs = 1;
  options.ns_batch_bytes = ns_batch_bytes;
  options.stage_bytes = 0;
  return options;
}

// The engine times the batches its stages form: sizes 1, 2 and the largest (3 at the NS
// bound), never more; a plan batch of n matrices costs the batches it is cut into; over a
// transport that moves no data every rank times alone.
TEST(CostProfile, EngineTimesTheBatchesItsStagesFormOnEveryRankOfAFakeWorld) {
  const World world(eleven_and_one(), 4, 1, 3);
  dmuon::step::CpuOps cpu;
  const int64_t three = cpu.ns_workspace_bytes(6, 10, 3, DType::kFloat32, gram().algorithm);
  const EngineOptions options = measuring(temp_path("fake.txt"), three);
  for (int rank : {0, 3}) {
    ScriptedOps ops({1.0});
    dmuon::testing::NoDataTransport transport(rank, 4);
    const dmuon::step::StepEngine engine(transport, ops, world.specs(), options);
    using Point = std::tuple<int64_t, int64_t, int64_t>;
    std::vector<Point> timed;
    for (const auto& [rows, cols, count, seconds] : engine.measured_costs().entries())
      timed.emplace_back(rows, cols, count);
    EXPECT_EQ(timed, (std::vector<Point>{{6, 10, 1}, {6, 10, 2}, {6, 10, 3}, {10, 4, 1}})) << "rank " << rank;
    if (rank == 0) EXPECT_EQ(ops.counts, (std::vector<int64_t>{1, 2, 3, 1}));
    if (rank == 3) EXPECT_TRUE(ops.counts.empty()) << "the store of this process already holds them";
  }
  // The cost of n matrices: make_stages' cut, ⌈n/3⌉ batches of ⌈n/⌈n/3⌉⌉, the last the rest.
  ScriptedOps ops({1.0, 1.5, 2.25, 0.5});
  dmuon::testing::NoDataTransport transport(1, 4);
  std::string error;
  const EngineOptions fresh = measuring(temp_path("cost.txt"), three);
  const dmuon::step::ItemTable items(world.specs(), 4);
  dmuon::plan::CostTable measured;
  const auto cost = dmuon::step::planning_cost(items, ops, transport, fresh, DType::kFloat32, measured, error);
  ASSERT_EQ(error, "");
  const double t1 = measured.seconds(6, 10, 1), t2 = measured.seconds(6, 10, 2), t3 = measured.seconds(6, 10, 3);
  ASSERT_EQ(std::vector<double>({t1, t2, t3}), std::vector<double>({1.0, 1.5, 2.25}));
  EXPECT_DOUBLE_EQ(cost(6, 10, 3), t3);
  EXPECT_DOUBLE_EQ(cost(6, 10, 4), 2 * t2);
  EXPECT_DOUBLE_EQ(cost(6, 10, 7), 2 * t3 + t1);
  EXPECT_DOUBLE_EQ(cost(6, 10, 11), 3 * t3 + t2);
}

// Over a world that moves data rank 0 measures and every rank plans with its table (the
// same plan); the other ranks time nothing.
TEST(CostProfile, Rank0sTableIsSharedWithEveryRank) {
  constexpr int kWorld = 3;
  const World world(eleven_and_one(), kWorld, 1, 4);
  const EngineOptions options = measuring(temp_path("shared.txt"), int64_t{1} << 30);
  dmuon::testing::LoopbackWorld loopback(kWorld);
  std::vector<std::vector<std::tuple<int64_t, int64_t, int64_t, double>>> tables(kWorld);
  std::vector<uint64_t> hashes(kWorld);
  std::vector<std::vector<int64_t>> counts(kWorld);
  const auto errors = loopback.run([&](int r) {
    ScriptedOps ops({0.125 * (r + 1)});
    const dmuon::step::StepEngine engine(loopback.transport(r), ops, world.specs(), options);
    tables[static_cast<size_t>(r)] = engine.measured_costs().entries();
    hashes[static_cast<size_t>(r)] = engine.plan_hash();
    counts[static_cast<size_t>(r)] = ops.counts;
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(tables[static_cast<size_t>(r)], tables[0]) << "rank " << r;
    EXPECT_EQ(hashes[static_cast<size_t>(r)], hashes[0]) << "rank " << r;
    if (r > 0) EXPECT_TRUE(counts[static_cast<size_t>(r)].empty()) << "rank " << r;
  }
  ASSERT_FALSE(tables[0].empty());
  for (const auto& entry : tables[0]) EXPECT_DOUBLE_EQ(std::get<3>(entry), 0.125);
}

// A failure on rank 0, or a rank whose cost option differs from rank 0's: every rank
// raises naming it, none hangs.
TEST(CostProfile, FailureOrMismatchedOptionsRaiseOnEveryRank) {
  const World world(eleven_and_one(), 2, 1, 5);
  for (const std::string& fault : {"failure", "mismatch"}) {
    dmuon::testing::LoopbackWorld loopback(2);
    const auto errors = loopback.run([&](int r) {
      ScriptedOps ops({1.0});
      ops.fail = fault == "failure" && r == 0;
      EngineOptions options = measuring(temp_path(fault + ".txt"), int64_t{1} << 30);
      options.cost.measure = !(fault == "mismatch" && r == 1);
      const dmuon::step::StepEngine engine(loopback.transport(r), ops, world.specs(), options);
    });
    for (int r = 0; r < 2; ++r) {
      const std::string& e = errors[static_cast<size_t>(r)];
      if (fault == "failure") {
        EXPECT_NE(e.find("measuring the NS cost table failed on rank 0: "), std::string::npos) << e;
        EXPECT_NE(e.find("scripted failure of an NS batch"), std::string::npos) << e;
      } else if (r == 1) {
        EXPECT_NE(e.find("the cost model differs between ranks: rank 0 measures NS times, rank 1 plans with the "
                         "analytic model"),
                  std::string::npos)
            << e;
      } else {
        EXPECT_NE(e.find("planning owners failed on another rank"), std::string::npos) << e;
      }
    }
  }
}

// A store rank 0 cannot write (a directory at its path, a path no directory can be made
// for, a disk that fills while it is written): one warning naming the file, and every rank
// of a loopback world of 3 plans with rank 0's measured table, no rank failing. Each case
// in a child process, so that the file-size limit ends with it; exit code 0: as expected.
TEST(CostProfile, AStoreRank0CannotWriteIsOneWarningAndEveryRankPlansOn) {
  const std::string dir_at_path = temp_path("dir_at_path");
  ASSERT_EQ(::mkdir(dir_at_path.c_str(), 0755), 0);
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {dir_at_path, [] {}},
      {"/proc/self/dmuon_no_such_dir/costs.txt", [] {}},
      {temp_path("full.txt"),
       [] {
         std::signal(SIGXFSZ, SIG_IGN);  // NOTE: else the limit kills instead of failing the write
         const rlimit small{16, 16};
         ::setrlimit(RLIMIT_FSIZE, &small);
       }},
  };
  constexpr int kWorld = 3;
  const World world(eleven_and_one(), kWorld, 1, 4);
  for (const auto& [path, spoil] : cases) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      spoil();
      Warnings warnings;
      dmuon::testing::LoopbackWorld loopback(kWorld);
      std::vector<size_t> table_sizes(kWorld);
      std::vector<uint64_t> hashes(kWorld);
      const auto errors = loopback.run([&](int r) {
        ScriptedOps ops({0.25});
        const dmuon::step::StepEngine engine(loopback.transport(r), ops, world.specs(),
                                             measuring(path, int64_t{1} << 30));
        table_sizes[static_cast<size_t>(r)] = engine.measured_costs().size();
        hashes[static_cast<size_t>(r)] = engine.plan_hash();
      });
      int rc = 0;
      for (int r = 0; r < kWorld; ++r) {
        if (!errors[static_cast<size_t>(r)].empty() || table_sizes[static_cast<size_t>(r)] == 0 ||
            hashes[static_cast<size_t>(r)] != hashes[0]) {
          std::fprintf(stderr, "%s: rank %d: '%s', %zu entries\n", path.c_str(), r, errors[static_cast<size_t>(r)].c_str(),
                       table_sizes[static_cast<size_t>(r)]);
          rc = 1;
        }
      }
      // NOTE: a directory at the path is also warned of when the store is read.
      int write_warnings = 0;
      for (const std::string& w : warnings.seen) {
        write_warnings += w.find("cannot write the cache") != std::string::npos;
        if (w.find(path) == std::string::npos) rc = 2;
      }
      if (write_warnings != 1) rc = 2;
      if (rc == 2)
        for (const std::string& w : warnings.seen) std::fprintf(stderr, "%s: warning '%s'\n", path.c_str(), w.c_str());
      ::_exit(rc);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << path << ": status " << status;
  }
  ::rmdir(dir_at_path.c_str());
}

}  // namespace
