// dmuon/ns/cuda/sm90_sym_config.h — configurations of the sm_90a symmetric kernel: names,
// the built instances and whether one can run a product. Host code without CUDA headers
// (part of the core in every build, tested on machines without a GPU).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ns/cuda/sym_product_args.h"

namespace dmuon::ns::cuda {

/// How a tile's result reaches global memory (see sm90_sym_kernel.cuh).
enum class Sm90Epilogue { kDirect, kStaged, kTmaStore };

/// Configuration of the kernel (compile-time instances: stages 4–6 × direct/staged,
/// stages 4–5 × tmastore; 2-CTA clusters: tmastore s4–s5, staged s6; 128×256 units: staged
/// s3, direct s3–s4, tmastore s3–s4 (1-CTA and 2-CTA clusters); split-K is a runtime switch
/// of the 128×128 tmastore instances and of the 2-CTA 128×256 ones).
struct Sm90SymConfig {
  int tile = 128;    ///< square output tile (rows = cols)
  int tile_k = 64;   ///< k extent of one pipeline stage
  int stages = 5;    ///< TMA → WGMMA pipeline depth
  int num_ctas = 0;  ///< persistent CTAs (0: one per SM; clusters: an even count)
  Sm90Epilogue epilogue = Sm90Epilogue::kDirect;
  int cluster = 1;   ///< CTAs per cluster: 2 shares one operand panel by TMA multicast ("mc2-")
  /// Columns of a work unit: 128 (one tile), or 256 ("n256-": two column tiles over one
  /// 256-row B panel, 64×256 WGMMAs; 1-CTA staged s3, direct s3–s4, tmastore s3–s4; 2-CTA
  /// clusters tmastore s3–s4).
  int tile_n = 128;
  /// Tail split-K ("sk-", tmastore only): the units of the last, partial wave run as k-slices
  /// on every CTA, summed by the last slice to finish (SymProductArgs::scratch).
  bool split_k = false;

  std::string name() const;  ///< e.g. "sm90:staged:s5:c0", "sm90:mc2-tmastore:s4:c0",
                             ///< "sm90:sk-tmastore:s5:c0", "sm90:n256-staged:s4:c0"
  /// Parse name(); false when the text names no built configuration.
  static bool parse(const std::string& text, Sm90SymConfig* config);
};

/// Every built configuration, in a fixed order (the autotuner's candidates; num_ctas 0).
/// Of the 2-CTA cluster ones only mc2-tmastore s5; the others and the 128×256 ones
/// (sm90_sym_experimental_configs) are appended only when DMUON_SYM_EXPERIMENTAL=1.
std::vector<Sm90SymConfig> sm90_sym_configs();

/// The configurations that won no measured shape (2-CTA clusters: tmastore s4, staged s6,
/// split tmastore s5; 128×256 units: staged s3, direct s3–s4, tmastore s4 1-CTA and 2-CTA
/// with and without the split); callable by name whether or not DMUON_SYM_EXPERIMENTAL is
/// set.
std::vector<Sm90SymConfig> sm90_sym_experimental_configs();

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
