// dmuon/ns/cuda/sm90_sym_config.cpp — names, parsing and applicability of the sm_90a
// symmetric kernel's configurations (host code, built whether or not the kernel is).
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "ns/cuda/sm90_sym_product.h"

namespace dmuon::ns::cuda {

namespace {
// NOTE: the tmastore epilogue's two 32 KiB tiles leave room for 5 stages (227 KiB).
int max_stages(Sm90Epilogue epilogue) { return epilogue == Sm90Epilogue::kTmaStore ? 5 : 6; }
}  // namespace

std::string Sm90SymConfig::name() const {
  std::ostringstream out;
  const char* epilogue_name = epilogue == Sm90Epilogue::kStaged     ? "staged"
                              : epilogue == Sm90Epilogue::kTmaStore ? "tmastore"
                                                                    : "direct";
  out << "sm90:" << epilogue_name << ":s" << stages
      << ":c" << num_ctas;
  return out.str();
}

bool Sm90SymConfig::parse(const std::string& text, Sm90SymConfig* config) {
  char epilogue[16] = {0};
  int stages = 0, ctas = 0;
  if (std::sscanf(text.c_str(), "sm90:%15[a-z]:s%d:c%d", epilogue, &stages, &ctas) != 3) return false;
  Sm90SymConfig c;
  const std::string e(epilogue);
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
  if (stages < 4 || stages > max_stages(c.epilogue) || ctas < 0) return false;
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
  for (int stages : {4, 5}) {
    Sm90SymConfig c;
    c.epilogue = Sm90Epilogue::kTmaStore;
    c.stages = stages;
    configs.push_back(c);
  }
  return configs;
}

std::string sm90_sym_config_rejects(const SymProductArgs& args, const Sm90SymConfig& config) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  std::ostringstream why;
  if (config.tile != 128 || config.tile_k != 64 || config.stages < 4 || config.stages > max_stages(config.epilogue))
    why << "configuration " << config.tile << "x" << config.tile << "x" << config.tile_k << ", "
        << config.stages << " stages is not built (tile 128x128x64, 4-6 stages, 4-5 for tmastore)";
  else if (!aligned(args.a) || !aligned(args.b))
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
           (!aligned(args.d) || args.ldd % 8 || args.stride_d % 8))
    why << "the staged epilogue needs a 16-byte aligned D with ldd and batch stride multiples of 8";
  else if (config.epilogue == Sm90Epilogue::kTmaStore &&
           (!aligned(args.d) || args.ldd % 8 || args.stride_d % 8 ||
            (args.beta != 0.0 && (!aligned(args.c) || args.ldc % 8 || args.stride_c % 8))))
    why << "the tmastore epilogue needs 16-byte aligned D and C with leading dimensions and batch strides "
           "multiples of 8 (TMA)";
  return why.str();
}

}  // namespace dmuon::ns::cuda
