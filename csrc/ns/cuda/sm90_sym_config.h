// dmuon/ns/cuda/sm90_sym_config.h — configurations of the sm_90a symmetric kernel: names,
// the built instances and whether one can run a product. Host code without CUDA headers
// (part of the core in every build, tested on machines without a GPU).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ns/cuda/sym_product_args.h"

namespace dmuon::ns::cuda {

/// How a tile's result reaches global memory (see sm90_sym_epilogue.cuh).
enum class Sm90Epilogue { kDirect, kStaged, kTmaStore };

/// Configuration of the kernel. Which ones are built: sm90_sym_instances.def, the one list
/// (its experimental ones only with the CMake option DMUON_EXPERIMENTAL_KERNELS=ON); split-K
/// is a runtime switch of the instances that have it.
struct Sm90SymConfig {
  int tile = 128;    ///< square output tile (rows = cols)
  int tile_k = 64;   ///< k extent of one pipeline stage
  int stages = 5;    ///< TMA → WGMMA pipeline depth
  int num_ctas = 0;  ///< persistent CTAs (0: one per SM; clusters: an even count)
  Sm90Epilogue epilogue = Sm90Epilogue::kDirect;
  int cluster = 1;   ///< CTAs per cluster: 2 shares one operand panel by TMA multicast ("mc2-")
  /// Columns of a work unit: 128 (one tile), or 256 ("n256-": two column tiles over one
  /// 256-row B panel, 64×256 WGMMAs).
  int tile_n = 128;
  /// Tail split-K ("sk-", tmastore only): the units of the last, partial wave run as k-slices
  /// on every CTA, summed by the last slice to finish (SymProductArgs::scratch).
  bool split_k = false;

  std::string name() const;  ///< e.g. "sm90:staged:s5:c0", "sm90:mc2-tmastore:s4:c0",
                             ///< "sm90:sk-tmastore:s5:c0", "sm90:n256-staged:s4:c0"
  /// Parse name(); false when the text names no built configuration.
  static bool parse(const std::string& text, Sm90SymConfig* config);
};

/// Every built configuration, in the order of sm90_sym_instances.def (the autotuner's
/// candidates; num_ctas 0): its default ones, and its experimental ones in a build with
/// DMUON_EXPERIMENTAL_KERNELS=ON.
std::vector<Sm90SymConfig> sm90_sym_configs();

/// The experimental configurations of sm90_sym_instances.def (they won no measured shape),
/// whether or not this build has them.
std::vector<Sm90SymConfig> sm90_sym_experimental_configs();

/// Whether this build has the experimental configurations (DMUON_EXPERIMENTAL_KERNELS=ON).
bool sm90_sym_experimental_built();

/// Empty when `text` parses (Sm90SymConfig::parse); else why not: an experimental
/// configuration of a build without them (naming the build option), or no configuration.
std::string sm90_sym_name_rejects(const std::string& text);

/// Bytes of SymProductArgs::scratch a split-K configuration needs with `num_ctas` CTAs:
/// one fp32 partial unit (128 × tile_n) and one counter per CTA.
size_t sm90_sym_split_scratch_bytes(int num_ctas, int tile_n = 128);

/// Where the partial tiles start in that scratch: after the counters, 256-byte aligned.
size_t sm90_sym_split_counter_bytes(int num_ctas);

/// Empty when `config` can run `args` on a GPU of `num_sms` SMs, else the reason (alignment,
/// shape, unbuilt instance, too little split-K scratch). num_sms < 1: the SM count is
/// unknown (a split-K configuration is then refused, the others do not need it).
std::string sm90_sym_config_rejects(const SymProductArgs& args, const Sm90SymConfig& config, int num_sms);

}  // namespace dmuon::ns::cuda
