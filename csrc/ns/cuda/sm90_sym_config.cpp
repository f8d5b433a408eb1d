// dmuon/ns/cuda/sm90_sym_config.cpp — names, parsing and applicability of the sm_90a
// symmetric kernel's configurations (host code without CUDA, built in every build).
#include "ns/cuda/sm90_sym_config.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <utility>

#include "common/env.h"
#include "ns/cuda/alignment.h"

namespace dmuon::ns::cuda {

namespace {
// NOTE: the tmastore epilogue's two 32 KiB tiles leave room for 5 stages (227 KiB).
int max_stages(Sm90Epilogue epilogue) { return epilogue == Sm90Epilogue::kTmaStore ? 5 : 6; }

// The built 2-CTA cluster instances (sm90_sym_kernel.cuh, launch_instance).
// NOTE: tmastore because the X·Xᵀ shapes it is for are mainloop-bound and tmastore was the
// best epilogue on most shapes; staged s6 as the deepest ring (no tmastore tiles).
bool mc2_built(Sm90Epilogue epilogue, int stages) {
  return (epilogue == Sm90Epilogue::kTmaStore && (stages == 4 || stages == 5)) ||
         (epilogue == Sm90Epilogue::kStaged && stages == 6);
}

// The built 128×256-unit instances (sm90_sym_kernel.cuh, launch_instance).
// NOTE: a stage is 48 KiB: 4 fit (227 KiB), 3 beside the staged epilogue's two 32 KiB tiles.
bool n256_built(Sm90Epilogue epilogue, int stages) {
  return (epilogue == Sm90Epilogue::kStaged && stages == 3) ||
         (epilogue == Sm90Epilogue::kDirect && (stages == 3 || stages == 4));
}

// The wide tmastore family at `stages`: 1-CTA, and mc2 without and with the split.
void append_wide_tmastore(int stages, std::vector<Sm90SymConfig>* configs) {
  for (auto [cluster, split_k] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
    Sm90SymConfig c;
    c.epilogue = Sm90Epilogue::kTmaStore;
    c.stages = stages;
    c.tile_n = 256;
    c.cluster = cluster;
    c.split_k = split_k;
    configs->push_back(c);
  }
}

bool built(const Sm90SymConfig& c) {
  if (c.tile != 128 || c.tile_k != 64) return false;
  if (c.tile_n == 256) {
    // NOTE: the wide tmastore instances (1-CTA, and mc2 with split-K a runtime switch) are
    // s4 (four 48 KiB stages and one 32 KiB subtile buffer pair) and s3 (two subtile buffer
    // pairs beside three stages); the 1-CTA ones have no split (C7511 and spills, run K).
    if (c.epilogue == Sm90Epilogue::kTmaStore)
      return (c.stages == 3 || c.stages == 4) && (c.cluster == 2 || (c.cluster == 1 && !c.split_k));
    return !c.split_k && c.cluster == 1 && n256_built(c.epilogue, c.stages);
  }
  if (c.tile_n != 128) return false;
  // NOTE: split-K is a runtime switch of the 128×128 kernels; only their tmastore instances
  // (1-CTA and mc2) handle the slices that skip their epilogue (sm90_sym_kernel.cuh).
  if (c.split_k && c.epilogue != Sm90Epilogue::kTmaStore) return false;
  if (c.cluster == 2) return mc2_built(c.epilogue, c.stages);
  return c.cluster == 1 && c.stages >= 4 && c.stages <= max_stages(c.epilogue);
}
}  // namespace

std::string Sm90SymConfig::name() const {
  std::ostringstream out;
  const char* epilogue_name = epilogue == Sm90Epilogue::kStaged     ? "staged"
                              : epilogue == Sm90Epilogue::kTmaStore ? "tmastore"
                                                                    : "direct";
  out << "sm90:" << (cluster == 2 ? "mc2-" : "") << (tile_n == 256 ? "n256-" : "") << (split_k ? "sk-" : "")
      << epilogue_name << ":s" << stages << ":c" << num_ctas;
  return out.str();
}

bool Sm90SymConfig::parse(const std::string& text, Sm90SymConfig* config) {
  char epilogue[24] = {0};
  int stages = 0, ctas = 0;
  if (std::sscanf(text.c_str(), "sm90:%23[a-z0-9-]:s%d:c%d", epilogue, &stages, &ctas) != 3) return false;
  Sm90SymConfig c;
  std::string e(epilogue);
  if (e.rfind("mc2-", 0) == 0) {
    c.cluster = 2;
    e = e.substr(4);
  }
  if (e.rfind("n256-", 0) == 0) {
    c.tile_n = 256;
    e = e.substr(5);
  }
  if (e.rfind("sk-", 0) == 0) {
    c.split_k = true;
    e = e.substr(3);
  }
  if (e == "staged") {
    c.epilogue = Sm90Epilogue::kStaged;
  } else if (e == "direct") {
    c.epilogue = Sm90Epilogue::kDirect;
  } else if (e == "tmastore") {
    c.epilogue = Sm90Epilogue::kTmaStore;
  } else {
    return false;
  }
  c.stages = stages;
  c.num_ctas = ctas;
  if (!built(c) || ctas < 0 || (c.cluster == 2 && ctas % 2)) return false;
  if (c.name() != text) return false;
  *config = c;
  return true;
}

std::vector<Sm90SymConfig> sm90_sym_configs() {
  std::vector<Sm90SymConfig> configs;
  for (Sm90Epilogue e : {Sm90Epilogue::kStaged, Sm90Epilogue::kDirect})
    for (int stages : {4, 5, 6}) {
      Sm90SymConfig c;
      c.epilogue = e;
      c.stages = stages;
      configs.push_back(c);
    }
  // NOTE: tmastore against the best staged/direct configuration of the same run, range of
  // two runs (H200, 2026-11-29, scripts/sym_kernel_bench.py, fp16): β·C products 896³ b72
  // 1.56–1.57×, 1536³ b56–84 1.44–1.47×, 3584³ b7–28 1.22–1.32×; X·Xᵀ 896×4864 b72
  // 1.10–1.16×, 1536×8960 b28–84 1.03–1.11×, 256×1536 b56 1.14–1.17×; 3584×18944 b1–7
  // 0.94–1.05× (a wash: the staged and direct configurations stay candidates).
  // NOTE: 256×128 units (two row tiles over one column panel; commit ff991b6) were slower
  // than the best 128×128 configuration on every one of those shapes (speed 0.39–0.995× of it): removed.
  // NOTE: two CTAs an SM (commit 4cdedb2: direct epilogue, 3 stages, a one-warp producer and
  // 288 threads, since ptxas compiles under the two-CTA bound of 85 registers and the 64×128
  // WGMMA needs 90; it got 96 with 484 bytes of spills) were correct but ran at 0.56–0.84×
  // tmastore s5 on every shape (H200, 2026-11-29, BENCHMARKS.md run H): removed.
  // NOTE: ping-pong consumers (commits fd3f8e0–b4e2f25: each consumer warpgroup a whole
  // 128×128 tile with 128 accumulators, the two taking a CTA's units in turn behind a
  // mainloop order barrier, so one's epilogue runs under the other's WGMMAs) were correct
  // (bitwise the cooperative kernel's result) but no faster (H200, 2026-12-01, BENCHMARKS.md
  // run N, in turns): with one tile/mirror pair handed between the warpgroups (s4–s5)
  // 0.96–1.01× the best tmastore configuration on 7 shapes from 256³ +C to 3584×18944, and
  // racecheck flagged every mbarrier hand-over of the pair; with a pair per warpgroup (s3,
  // racecheck clean) 0.82–0.89×, 1.03× on 256³ +C only. The epilogue is not what limits
  // these products: removed.
  for (int stages : {4, 5}) {
    Sm90SymConfig c;
    c.epilogue = Sm90Epilogue::kTmaStore;
    c.stages = stages;
    configs.push_back(c);
  }
  // Tail split-K, tmastore s4–s5: the partial last wave of tiles as k-slices on every CTA.
  // NOTE: why: 3584×18944 X·Xᵀ is 406 triangle tiles, 3.08 waves on 132 SMs, the fourth
  // keeping 10 SMs busy for a whole tile's mainloop. Measured on an H200 (2026-11-29,
  // BENCHMARKS.md run F): 1.04× the best other configuration there, 0.81–0.99× on the other
  // shapes (a lone SM's tile runs faster than one of a full wave, so the tail cost less
  // than feared); the autotuner keeps it where it wins (the 7B step's batch-1 X·Xᵀ).
  for (int stages : {4, 5}) {
    Sm90SymConfig c;
    c.epilogue = Sm90Epilogue::kTmaStore;
    c.stages = stages;
    c.split_k = true;
    configs.push_back(c);
  }
  // 2-CTA cluster, TMA multicast of the shared panel, tmastore s5. NOTE: measured on an H200
  // (2026-11-29, scripts/device_multicast.sh, BENCHMARKS.md): against the best 1-CTA
  // configuration 1.08× on long-k X·Xᵀ at larger batches (1536×8960 b28, 3584×18944 b7),
  // 1.00–1.02× on 1536×8960 b84, 3584×18944 b1 and 3584×3584+C b28, 0.94–0.97× on the other
  // shapes; the autotuner keeps it where it wins. Memcheck and racecheck clean.
  {
    Sm90SymConfig c;
    c.epilogue = Sm90Epilogue::kTmaStore;
    c.stages = 5;
    c.cluster = 2;
    configs.push_back(c);
  }
  // Wide tmastore: 128×256 units with the TMA-store epilogue, s3 (three stages, two subtile
  // buffer pairs in turn): 1-CTA, and in 2-CTA clusters (a 256-row B panel multicast per
  // pair, as CUTLASS's 128×256 cluster-2 tiles) without and with the tail split-K.
  // NOTE: measured on an H200 (2026-11-30, BENCHMARKS.md run K, scripts/sym_kernel_bench.py,
  // fp16), the s4 kernels against the best 128×128 configuration, timed one after another:
  // X·Xᵀ 3584×18944 b15 1.12–1.21×, b7 1.05× (mc2 split), b1 0.87–0.89×; 3584³ +C b15 and
  // b28 0.99–1.06×; 1536×8960 b28 0.99×. Timed in turns (sequential timings drift by up to
  // 8%): b15 1.00–1.04× mc2-tmastore s5. The 7B step went from 440 to 427 ms with them. Run
  // L, in turns: s3 against s4 faster on 6 of 6 (mc2, 0.7–3.7%) and 7 of 8 shapes (1-CTA,
  // 1.8–8.7%; 1.6% slower on 896³ +C b24), so the s4 kernels are experimental now.
  append_wide_tmastore(3, &configs);
  // NOTE: DMUON_SYM_EXPERIMENTAL=1 (default 0) appends the configurations that won no
  // measured shape (the other cluster ones, the 128×256 ones), so that the autotuner,
  // ops.cuda_sym_configs() and the tests that walk it try them; they are callable by name
  // either way.
  if (env::kSymExperimental.get())
    for (const Sm90SymConfig& c : sm90_sym_experimental_configs()) configs.push_back(c);
  return configs;
}

std::vector<Sm90SymConfig> sm90_sym_experimental_configs() {
  // NOTE: 2-CTA clusters sharing one operand panel by TMA multicast (mc2) that won no
  // measured shape (tmastore s4 0.86–0.99×, staged s6 0.55–1.02× of the best 1-CTA
  // configuration, mc2-tmastore s5 faster than both everywhere; BENCHMARKS.md run E).
  std::vector<Sm90SymConfig> configs;
  for (auto [epilogue, stages] : {std::pair{Sm90Epilogue::kTmaStore, 4}, std::pair{Sm90Epilogue::kStaged, 6}}) {
    Sm90SymConfig c;
    c.epilogue = epilogue;
    c.stages = stages;
    c.cluster = 2;
    configs.push_back(c);
  }
  // mc2 with the tail split-K (whole waves of pairs multicast, the partial last wave of pairs
  // as k-slices on every cluster), tmastore s5.
  // NOTE: built because mc2 was the fastest configuration on long-k X·Xᵀ with full waves
  // (3584×18944 b7) and sk-tmastore at batch 1, where mc2 alone runs a whole wave for 5 of its
  // 203 pairs. Measured on an H200 (2026-11-30, BENCHMARKS.md run J): correct (the split and
  // cluster cases of test_gpu_autotune.py; racecheck clean) but 0.94× sk-tmastore s5 at
  // 3584×18944 b1 (mc2's full waves are slower than the 1-CTA kernel's there too), 1.01×
  // mc2-tmastore s5 at b7 and 3584³ +C b28, 0.91× on 1536×8960 b28: no measured gain
  // outside the noise, so not a default candidate.
  {
    Sm90SymConfig c;
    c.epilogue = Sm90Epilogue::kTmaStore;
    c.stages = 5;
    c.cluster = 2;
    c.split_k = true;
    configs.push_back(c);
  }
  // 128×256 units (n256): staged s3, direct s3–s4.
  // NOTE: built because CUTLASS's own dense kernels ran 128×256 tiles 14–18% faster than
  // 128×128 on the long-k X·Xᵀ shapes (scripts/cutlass_tile_probe.cu on an H200,
  // 2026-11-29, a build whose WGMMAs were serialized; rebuilt right, run J: equal at
  // 3584×18944 b1, 14% faster at b7, and under Nsight Compute at the power limit the wide
  // tiles ran 5–10% higher clocks); ours won no shape of scripts/sym_kernel_bench.py in three runs of the
  // same day: the best of them ran at 0.89–0.96× the best 128×128 configuration on
  // 3584×18944 X·Xᵀ (batch 1: 210 units are 1.6 waves of 132 CTAs), 0.78× on 896×4864
  // and 0.52–0.72× on the β·C products (its epilogues read C per element). BENCHMARKS.md
  // run G.
  for (auto [epilogue, stages] : {std::pair{Sm90Epilogue::kStaged, 3}, std::pair{Sm90Epilogue::kDirect, 3},
                                  std::pair{Sm90Epilogue::kDirect, 4}}) {
    Sm90SymConfig c;
    c.epilogue = epilogue;
    c.stages = stages;
    c.tile_n = 256;
    configs.push_back(c);
  }
  // Wide tmastore s4 (four stages, one subtile buffer pair): 1-CTA, and mc2 without and with
  // the split. NOTE: default candidates in run K; the s3 kernels (a subtile waits only for
  // the stores before the last) were faster on 13 of the 14 shape comparisons of run L,
  // timed in turns.
  append_wide_tmastore(4, &configs);
  return configs;
}

size_t sm90_sym_split_counter_bytes(int num_ctas) {
  return (static_cast<size_t>(std::max(num_ctas, 0)) * sizeof(int) + 255) / 256 * 256;
}

size_t sm90_sym_split_scratch_bytes(int num_ctas, int tile_n) {
  // NOTE: counters first, then the partial units (sm90_sym_kernel.cuh, launch).
  const size_t partial_unit_bytes = static_cast<size_t>(128) * tile_n * sizeof(float);
  return sm90_sym_split_counter_bytes(num_ctas) + static_cast<size_t>(std::max(num_ctas, 0)) * partial_unit_bytes;
}

std::string sm90_sym_config_rejects(const SymProductArgs& args, const Sm90SymConfig& config, int num_sms) {
  std::ostringstream why;
  if (!built(config))
    why << "configuration " << config.tile << "x" << config.tile << "x" << config.tile_k << ", " << config.stages
        << " stages, cluster " << config.cluster << ", unit columns " << config.tile_n
        << (config.split_k ? ", split-K" : "")
        << " is not built (tile 128x128x64, 4-6 stages, 4-5 for tmastore; cluster 2: tmastore s4-s5, staged s6;"
           " split-K: 128x128 tmastore, cluster 2 256-column tmastore; 256 unit columns: 1-CTA staged s3, direct "
           "s3-s4, tmastore s3-s4 (1-CTA or cluster 2))";
  else if (config.cluster == 2 && config.num_ctas % 2)
    why << "a 2-CTA cluster configuration needs an even CTA count (0: all SMs), got " << config.num_ctas;
  else if (!aligned16(args.a) || !aligned16(args.b))
    why << "A and B must be 16-byte aligned";
  else if (args.lda % 8 || args.ldb % 8 || args.stride_a % 8 || args.stride_b % 8)
    why << "lda/ldb and batch strides must be multiples of 8, got lda=" << args.lda << " ldb=" << args.ldb
        << " stride_a=" << args.stride_a << " stride_b=" << args.stride_b;
  else if (!(args.m >= 1 && args.k >= 1 && args.batch >= 1 && args.m < (1 << 30) && args.k < (1 << 30) &&
             args.batch < (1 << 30)))
    why << "invalid shape [" << args.batch << ", " << args.m << ", " << args.k << "]";
  else if (args.beta != 0.0 && args.c == nullptr)
    why << "beta != 0 needs C";
  else if (config.epilogue == Sm90Epilogue::kStaged &&
           (!aligned16(args.d) || args.ldd % 8 || args.stride_d % 8))
    why << "the staged epilogue needs a 16-byte aligned D with ldd and batch stride multiples of 8";
  else if (config.epilogue == Sm90Epilogue::kTmaStore &&
           (!aligned16(args.d) || args.ldd % 8 || args.stride_d % 8 ||
            (args.beta != 0.0 && (!aligned16(args.c) || args.ldc % 8 || args.stride_c % 8))))
    why << "the tmastore epilogue needs 16-byte aligned D and C with leading dimensions and batch strides "
           "multiples of 8 (TMA)";
  else if (config.split_k) {
    if (num_sms < 1) {
      why << "a split-K configuration needs the device's SM count, which is unknown";
    } else {
      const int ctas = config.num_ctas > 0 ? std::min(config.num_ctas, num_sms) : num_sms;
      const size_t needed = sm90_sym_split_scratch_bytes(ctas, config.tile_n);
      if (args.scratch == nullptr || args.scratch_bytes < needed ||
          reinterpret_cast<uintptr_t>(args.scratch) % 256 != 0)
        why << "a split-K configuration needs " << needed << " bytes of 256-byte aligned scratch, got "
            << args.scratch_bytes << (args.scratch == nullptr ? " (none)" : "");
    }
  }
  return why.str();
}

}  // namespace dmuon::ns::cuda
