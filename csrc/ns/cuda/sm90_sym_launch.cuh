// dmuon/ns/cuda/sm90_sym_launch.cuh — host launch of the sm_90a symmetric kernel: the
// checks of CuTe's accumulator layouts that the epilogues assume (run once, before the first
// launch), the kernel parameters of a product (make_params; mc2's pair list, the split-K
// tail), the persistent grid (one CTA an SM; mc2: the 2-CTA clusters that fit) and the
// switch from a configuration to its compiled instance (launch_instance). Included by
// sm90_sym_product_{f16,bf16}.cu, one translation unit per element type.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "ns/cuda/cuda_check.h"
#include "ns/cuda/sm90_sym_kernel.cuh"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

// Host checks of CuTe's accumulator layout (evaluated on the host, before the first launch):
// whether every consumer thread holds `values` accumulators of a kTile × kTileN unit and
// ok(thread, v, row, col) holds for each accumulator v at (row, col) of the unit.
// NOTE: the threads are those of T::TiledMma (both consumer warpgroups).
template <class T, class Ok>
bool every_accumulator(int values, Ok ok) {
  typename T::TiledMma mma;
  for (int thread = 0; thread < static_cast<int>(size(mma)); ++thread) {
    Tensor coords = mma.get_thread_slice(thread).partition_C(
        make_identity_tensor(make_shape(Int<T::kTile>{}, Int<T::kTileN>{})));
    if (size(coords) != values) return false;
    for (int v = 0; v < size(coords); ++v)
      if (!ok(thread, v, static_cast<int>(get<0>(coords(v))), static_cast<int>(get<1>(coords(v))))) return false;
  }
  return true;
}

// n256: whether accumulators [kTileValues·h, kTileValues·(h + 1)) of every consumer thread
// hold exactly column tile h of the unit (the epilogue's assumption).
template <class T>
bool fragment_tiles_split_by_column() {
  return every_accumulator<T>(T::kColTiles * T::kTileValues,
                              [](int, int v, int, int col) { return col / T::kTile == v / T::kTileValues; });
}

// tmastore: whether every consumer thread's accumulators are in the mma fragment layout
// that the block epilogues assume (value v: row 16·warp + 8·((v/2)%2) + lane/4, column
// 8·(v/4) + 2·(lane%4) + v%2; a 128×256 unit's columns continue to 255).
template <class T>
bool fragment_is_mma_layout() {
  return every_accumulator<T>(T::kColTiles * T::kTileValues, [](int thread, int v, int row, int col) {
    const int warp = thread / 32, lane = thread % 32;
    return row == 16 * warp + 8 * ((v / 2) % 2) + lane / 4 && col == 8 * (v / 4) + 2 * (lane % 4) + v % 2;
  });
}

// The kernel parameters of a 1-CTA launch over every unit, no split (launch adds the mc2
// pair list and the split-K tail): operand views, the triangle's units, tmastore's D and C.
template <class T>
typename T::Params make_params(const SymProductArgs& args) {
  using Elem = typename T::Element;
  typename T::Params p{
      T::tma(static_cast<const Elem*>(args.a), static_cast<int>(args.m), static_cast<int>(args.k),
             static_cast<int>(args.batch), args.lda, args.stride_a),
      T::tma_b(static_cast<const Elem*>(args.b), static_cast<int>(args.m), static_cast<int>(args.k),
               static_cast<int>(args.batch), args.ldb, args.stride_b),
      {}, {},
      static_cast<int>(args.m), static_cast<int>(args.k), static_cast<int>(args.batch), 0, 0, 0,
      static_cast<const Elem*>(args.c), args.ldc, args.stride_c, static_cast<Elem*>(args.d), args.ldd,
      args.stride_d, static_cast<float>(args.alpha), static_cast<float>(args.beta), {}, {}, {},
      0, 1, nullptr, nullptr};
  p.num_row_tiles = static_cast<int>((args.m + T::kTile - 1) / T::kTile);
  // Units per matrix: lower-triangle tiles, or (n256) 128×256 units over them.
  p.num_tri = T::kColTiles == 1 ? static_cast<int64_t>(p.num_row_tiles) * (p.num_row_tiles + 1) / 2
                                : wide_units(p.num_row_tiles);
  p.num_work = p.num_tri * args.batch;
  p.num_full = p.num_work;
  if constexpr (T::kTmaStore) {
    const int m = static_cast<int>(args.m), batch = static_cast<int>(args.batch);
    if constexpr (!T::kWide) p.tma_d = T::tma_store_d(static_cast<Elem*>(args.d), m, batch, args.ldd, args.stride_d);
    // NOTE: without C the C view is D's (a valid descriptor that the kernel never loads).
    const bool with_c = args.beta != 0.0 && args.c != nullptr;
    if constexpr (T::kWide) {
      // NOTE: C (m × m) in the A panel's 128×64 boxes; D in 64×64 boxes.
      p.tma_d = T::tma_store_sub(static_cast<Elem*>(args.d), m, batch, args.ldd, args.stride_d);
      p.tma_c = with_c ? T::tma(static_cast<const Elem*>(args.c), m, m, batch, args.ldc, args.stride_c)
                       : T::tma(static_cast<const Elem*>(args.d), m, m, batch, args.ldd, args.stride_d);
    } else {
      p.tma_c = with_c ? T::tma_load_c(static_cast<const Elem*>(args.c), m, batch, args.ldc, args.stride_c)
                       : T::tma_load_c(static_cast<const Elem*>(args.d), m, batch, args.ldd, args.stride_d);
    }
  }
  return p;
}

// Raises the dynamic shared-memory limit of `kernel` to `bytes` on `device`, once per kernel
// and device. NOTE: a per-device function attribute; keyed by the kernel's address, since
// instances with the same parameter type share a function-pointer type.
inline void opt_in_shared_memory(const void* kernel, int bytes, int device) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.emplace(device, kernel).second)
    DMUON_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class Elem, int kStages, int kEpi, int kCluster = 1, int kTileN = 128>
void launch(const SymProductArgs& args, int num_ctas, bool split_k, cudaStream_t stream) {
  using T = Traits<Elem, kStages, kEpi, kCluster, kTileN>;
  if constexpr (T::kColTiles > 1) {
    static const bool split_by_column = fragment_tiles_split_by_column<T>();
    DMUON_CHECK(split_by_column, "sm90_sym_product: the 128x", kTileN,
                " accumulator fragment is not split by column tile (CuTe layout changed?)");
  }
  if constexpr (T::kTmaStore) {
    static const bool mma_layout = fragment_is_mma_layout<T>();
    DMUON_CHECK(mma_layout, "sm90_sym_product: the accumulator fragment is not the mma layout the tmastore "
                            "epilogue assumes (CuTe layout changed?)");
  }
  typename T::Params p = make_params<T>(args);
  if constexpr (kCluster > 1) {
    const int m = static_cast<int>(args.m), k = static_cast<int>(args.k), batch = static_cast<int>(args.batch);
    p.tma_am = T::tma_mc(static_cast<const Elem*>(args.a), m, k, batch, args.lda, args.stride_a);
    p.tma_bm = T::tma_mc_b(static_cast<const Elem*>(args.b), m, k, batch, args.ldb, args.stride_b);
    p.pairs = T::kColTiles == 2 ? make_wide_pair_list(p.num_row_tiles, batch) : make_pair_list(p.num_row_tiles, batch);
    p.num_work = p.pairs.num_units;  // NOTE: mc2 works on pairs of tiles
    p.num_full = p.num_work;
  }

  // Launch: persistent grid of min(work, CTAs) CTAs, one per SM (mc2: whole clusters).
  auto kernel = sym_product_kernel<Elem, kStages, kEpi, kCluster, kTileN>;
  static_assert(sizeof(typename T::SharedStorage) <= 227 * 1024, "over the 227 KiB shared-memory opt-in");
  const int smem_bytes = static_cast<int>(sizeof(typename T::SharedStorage));
  int device = 0, num_sms = 0;
  DMUON_CHECK_CUDA(cudaGetDevice(&device));
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, device);
  DMUON_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t ctas = num_ctas > 0 ? std::min<int64_t>(num_ctas, num_sms) : num_sms;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute[1];
  // One wave: the units that run at once (CTAs; mc2: clusters, each running one pair).
  int64_t wave = ctas;
  if constexpr (kCluster > 1) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = kCluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    config.blockDim = dim3(T::kNumThreads, 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    // NOTE: one CTA per SM and clusters confined to a GPC: with GPCs of odd SM counts
    // fewer than num_sms / 2 clusters fit. Asked once per device (the attribute set above
    // comes first: the occupancy query sees the opt-in).
    static std::mutex mutex;
    static std::map<int, int> fitting_clusters;
    int max_clusters = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = fitting_clusters.find(device);
      if (it == fitting_clusters.end()) {
        config.gridDim = dim3(static_cast<unsigned>(num_sms / kCluster * kCluster), 1, 1);
        DMUON_CHECK_CUDA(cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config));
        it = fitting_clusters.emplace(device, max_clusters).first;
      }
      max_clusters = it->second;
    }
    DMUON_CHECK(max_clusters > 0, "sm90_sym_product: no 2-CTA cluster of this kernel fits on device ", device);
    wave = std::max<int64_t>(std::min<int64_t>(ctas / kCluster, max_clusters), 1);
  }
  // Split-K: whole waves of units as they are, the tail units cut into k-slices (header).
  if (split_k) {
    DMUON_CHECK(T::kCanSplit, "sm90_sym_product: this instance has no split-K");
    const int num_k_tiles = (p.k + T::kTileK - 1) / T::kTileK;
    const int64_t full = p.num_work / wave * wave, tail = p.num_work - full;
    DMUON_CHECK(args.scratch != nullptr &&
                    args.scratch_bytes >= sm90_sym_split_scratch_bytes(static_cast<int>(ctas), T::kTileN),
                "sm90_sym_product: split-K scratch too small");
    // NOTE: at most `wave` slices of tail units, so at most ctas partial units (mc2: two a pair).
    const int64_t split = tail == 0 ? 1 : choose_tail_split(tail, wave, num_k_tiles);
    if (split >= 2) {
      p.num_full = full;
      p.split = static_cast<int>(split);
      p.num_work = full + tail * split;
      p.counters = static_cast<int*>(args.scratch);
      p.partials = reinterpret_cast<float*>(static_cast<char*>(args.scratch) +
                                            sm90_sym_split_counter_bytes(static_cast<int>(ctas)));
      DMUON_CHECK_CUDA(
          cudaMemsetAsync(p.counters, 0, static_cast<size_t>(tail * kCluster) * sizeof(int), stream));
    }
  }
  if constexpr (kCluster == 1) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.num_work, ctas));
    kernel<<<grid, T::kNumThreads, smem_bytes, stream>>>(p);
  } else {
    // mc2 launch: a persistent grid of whole clusters (2 × 1 × 1), no more than fit at once.
    const int64_t clusters = std::min<int64_t>(p.num_work, wave);
    config.gridDim = dim3(static_cast<unsigned>(std::max<int64_t>(clusters, 1) * kCluster), 1, 1);
    DMUON_CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, p));
  }
  DMUON_CHECK_CUDA(cudaGetLastError());
}

// Every built configuration of one element type (sm90_sym_instances.def; the experimental
// ones with DMUON_EXPERIMENTAL_KERNELS), run by its instance; false when `config` is none of
// them. NOTE: the configurations that differ only in split-K share one instance.
template <class Elem>
bool launch_instance(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  if (config.tile != 128 || config.tile_k != 64) return false;
#define DMUON_SM90_SYM_DEFAULT(EPILOGUE, STAGES, CLUSTER, TILE_N, SPLIT_K)                                     \
  if (config.epilogue == Sm90Epilogue::k##EPILOGUE && config.stages == (STAGES) &&                              \
      config.cluster == (CLUSTER) && config.tile_n == (TILE_N) && config.split_k == ((SPLIT_K) != 0)) {         \
    launch<Elem, STAGES, static_cast<int>(Sm90Epilogue::k##EPILOGUE), CLUSTER, TILE_N>(args, config.num_ctas,  \
                                                                                       config.split_k, stream); \
    return true;                                                                                                \
  }
#if defined(DMUON_EXPERIMENTAL_KERNELS)
#define DMUON_SM90_SYM_EXPERIMENTAL(...) DMUON_SM90_SYM_DEFAULT(__VA_ARGS__)
#else
#define DMUON_SM90_SYM_EXPERIMENTAL(...)
#endif
#include "ns/cuda/sm90_sym_instances.def"
  return false;
}

}  // namespace dmuon::ns::cuda::sm90
