// dmuon/ns/cuda/sm90_sym_config.cpp — names, parsing and applicability of the sm_90a
// symmetric kernel's configurations (host code without CUDA, built in every build).
#include "ns/cuda/sm90_sym_config.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <utility>

#include "ns/cuda/alignment.h"

namespace dmuon::ns::cuda {

namespace {
// One configuration of sm90_sym_instances.def (num_ctas 0) and whether it is experimental.
struct Listed {
  Sm90SymConfig config;
  bool experimental;
};

// Every configuration of the .def, built or not, in its order.
const std::vector<Listed>& listed() {
  static const std::vector<Listed> all = [] {
    std::vector<Listed> out;
    auto add = [&out](Sm90Epilogue epilogue, int stages, int cluster, int tile_n, int split_k, bool experimental) {
      Sm90SymConfig c;
      c.epilogue = epilogue;
      c.stages = stages;
      c.cluster = cluster;
      c.tile_n = tile_n;
      c.split_k = split_k != 0;
      out.push_back({c, experimental});
    };
#define DMUON_SM90_SYM_DEFAULT(EPILOGUE, STAGES, CLUSTER, TILE_N, SPLIT_K) \
  add(Sm90Epilogue::k##EPILOGUE, STAGES, CLUSTER, TILE_N, SPLIT_K, false);
#define DMUON_SM90_SYM_EXPERIMENTAL(EPILOGUE, STAGES, CLUSTER, TILE_N, SPLIT_K) \
  add(Sm90Epilogue::k##EPILOGUE, STAGES, CLUSTER, TILE_N, SPLIT_K, true);
#include "ns/cuda/sm90_sym_instances.def"
    return out;
  }();
  return all;
}

// The same compiled configuration (the CTA count aside).
bool same_configuration(const Sm90SymConfig& a, const Sm90SymConfig& b) {
  return a.tile == b.tile && a.tile_k == b.tile_k && a.stages == b.stages && a.epilogue == b.epilogue &&
         a.cluster == b.cluster && a.tile_n == b.tile_n && a.split_k == b.split_k;
}

bool built(const Sm90SymConfig& c) {
  for (const Listed& l : listed())
    if (same_configuration(l.config, c)) return !l.experimental || sm90_sym_experimental_built();
  return false;
}

// The names of the built configurations ("sm90:staged:s4, …"), for the error of an unbuilt one.
std::string built_names() {
  std::string names;
  for (const Sm90SymConfig& c : sm90_sym_configs()) {
    const std::string name = c.name();
    names += (names.empty() ? "" : ", ") + name.substr(0, name.rfind(":c"));
  }
  return names;
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

namespace {
// The configuration `text` names (num_ctas included) among the listed ones, built or not.
bool parse_listed(const std::string& text, Sm90SymConfig* config) {
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
  const bool is_listed = std::any_of(listed().begin(), listed().end(),
                                     [&](const Listed& l) { return same_configuration(l.config, c); });
  if (!is_listed || ctas < 0 || (c.cluster == 2 && ctas % 2)) return false;
  if (c.name() != text) return false;
  *config = c;
  return true;
}
}  // namespace

bool Sm90SymConfig::parse(const std::string& text, Sm90SymConfig* config) {
  Sm90SymConfig c;
  if (!parse_listed(text, &c) || !built(c)) return false;
  *config = c;
  return true;
}

std::string sm90_sym_name_rejects(const std::string& text) {
  Sm90SymConfig c;
  if (Sm90SymConfig::parse(text, &c)) return "";
  if (parse_listed(text, &c))
    return "'" + text + "' is an experimental configuration, not built (build with -DDMUON_EXPERIMENTAL_KERNELS=ON)";
  return "'" + text + "' names no configuration of the symmetric kernel (sm90:[mc2-][n256-][sk-]EPILOGUE:sSTAGES:cCTAS; "
         "built: " + built_names() + ")";
}

bool sm90_sym_experimental_built() {
#if defined(DMUON_EXPERIMENTAL_KERNELS)
  return true;
#else
  return false;
#endif
}

std::vector<Sm90SymConfig> sm90_sym_configs() {
  std::vector<Sm90SymConfig> configs;
  for (const Listed& l : listed())
    if (!l.experimental || sm90_sym_experimental_built()) configs.push_back(l.config);
  return configs;
}

std::vector<Sm90SymConfig> sm90_sym_experimental_configs() {
  std::vector<Sm90SymConfig> configs;
  for (const Listed& l : listed())
    if (l.experimental) configs.push_back(l.config);
  return configs;
}

size_t sm90_sym_split_counter_bytes(int num_ctas) {
  return (static_cast<size_t>(std::max(num_ctas, 0)) * sizeof(int) + 255) / 256 * 256;
}

size_t sm90_sym_split_scratch_bytes(int num_ctas, int tile_n) {
  // NOTE: counters first, then the partial units (sm90_sym_launch.cuh, launch).
  const size_t partial_unit_bytes = static_cast<size_t>(128) * tile_n * sizeof(float);
  return sm90_sym_split_counter_bytes(num_ctas) + static_cast<size_t>(std::max(num_ctas, 0)) * partial_unit_bytes;
}

std::string sm90_sym_config_rejects(const SymProductArgs& args, const Sm90SymConfig& config, int num_sms) {
  std::ostringstream why;
  if (!built(config))
    why << "configuration " << config.tile << "x" << config.tile << "x" << config.tile_k << ", " << config.stages
        << " stages, cluster " << config.cluster << ", unit columns " << config.tile_n
        << (config.split_k ? ", split-K" : "")
        << " is not built (built: " << built_names() << "; each with :c<CTAs>"
        << (sm90_sym_experimental_built() ? ")" : "; -DDMUON_EXPERIMENTAL_KERNELS=ON builds the experimental ones)");
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
