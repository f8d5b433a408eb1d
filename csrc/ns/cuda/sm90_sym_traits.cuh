// dmuon/ns/cuda/sm90_sym_traits.cuh — the sm_90a symmetric kernel's compile-time shape
// and its launch parameters (part of sm90_sym_kernel.cuh, split by role as DeepGEMM splits
// its kernels). Traits<Elem, stages, epilogue, cluster, unit columns> fixes one instance:
// the 128×128×64 tile (128×256 units for "n256"), the swizzled shared-memory ring and
// epilogue buffers (SharedStorage), the TMA descriptors of A, B, C and D, and Params, the
// kernel's one argument (filled on the host by sm90_sym_launch.cuh's make_params/launch).
#pragma once

// NOTE: cute/tensor.hpp must come first (the atom headers assume its declarations).
#include <cute/tensor.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include <cstdint>

#include "ns/cuda/sm90_sym_pairs.h"
#include "ns/cuda/sm90_sym_product.h"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

// Compile-time shape of the kernel.
// NOTE: 128×128×64 tiles are 32 KiB a stage; 64 fp32 accumulators per consumer thread;
// one CTA per SM. Square tiles keep diagonal tiles aligned with the triangle. The staged
// epilogue adds a 32 KiB 16-bit tile, so it fits up to 6 stages (227 KiB limit).
// NOTE: the tmastore epilogue keeps two 32 KiB tiles (tile, mirror): up to 5 stages.
// NOTE: kClusterT = 2: the "mc2" variant (2-CTA clusters, one operand panel multicast;
// docs/design/sm90_sym_kernel.md, "2-CTA clusters"). 1: the plain kernel.
// NOTE: kTileNT = 256: the "n256" variant (128×256 units, same document, "128×256 units").
template <class Elem, int kStagesT, int kEpiT, int kClusterT = 1, int kTileNT = 128>
struct Traits {
  using Element = Elem;
  static constexpr int kTile = 128;
  static constexpr int kTileK = 64;
  static constexpr int kStages = kStagesT;
  static constexpr int kCluster = kClusterT;
  static_assert(kCluster == 1 || kCluster == 2, "clusters of 1 or 2 CTAs");
  // Columns of a unit (one B panel): 128, or 256 = two column tiles.
  static constexpr int kTileN = kTileNT;
  static constexpr int kColTiles = kTileN / kTile;
  static constexpr bool kStaged = kEpiT == static_cast<int>(Sm90Epilogue::kStaged);
  static constexpr bool kTmaStore = kEpiT == static_cast<int>(Sm90Epilogue::kTmaStore);
  // 128×256 units with the tmastore epilogue ("wide tmastore"; docs/design/sm90_sym_kernel.md).
  static constexpr bool kWide = kColTiles == 2 && kTmaStore;
  static_assert(kColTiles == 1 || (kColTiles == 2 && (kCluster == 1 || kTmaStore)),
                "128x256 units: 1-CTA with any epilogue, 2-CTA clusters with tmastore");
  // Instances with the tail split-K compiled in: the 128×128 tmastore ones and mc2's wide one.
  // NOTE: in the 1-CTA wide instance its registers made ptxas serialize the WGMMAs (C7511,
  // 2 KiB of spills; nvcc 13), in the staged and direct ones likewise.
  static constexpr bool kCanSplit = kTmaStore && (kColTiles == 1 || kCluster == 2);
  static constexpr int kNumConsumerThreads = 256;
  static constexpr int kNumThreads = 128 + kNumConsumerThreads;
  static constexpr int kTxBytes = (kTile + kTileN) * kTileK * static_cast<int>(sizeof(Elem));
  // fp32 accumulators per consumer thread for one 128×128 output tile.
  static constexpr int kTileValues = kTile * kTile / kNumConsumerThreads;
  static constexpr int kEpilogueElems = kStaged ? kTile * kTileN : 8;
  // tmastore: the tile and mirror buffers (wide: a 128×64 subtile and its 64×128 mirror).
  static constexpr int kTmaTileElems = kWide ? kTile * 64 : kTmaStore ? kTile * kTile : 8;
  // Wide tmastore: subtile buffer pairs. NOTE: with 3 stages (144 KiB) two 32 KiB pairs fit,
  // used in turn, so a subtile waits only for the stores of the one before the last; with 4
  // stages one pair, and each subtile waits for the last one's stores.
  static constexpr int kEpiBuffers = (kWide && kStages == 3) ? 2 : 1;
  static constexpr int kTileBytes = kTile * kTile * static_cast<int>(sizeof(Elem));

  using SmemLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                            make_shape(Int<kTile>{}, Int<kTileK>{}, Int<kStages>{})));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                             make_shape(Int<kTileN>{}, Int<kTileK>{}, Int<kStages>{})));
  // Each consumer warpgroup: 64 rows × kTileN columns (n256: one 64×256×16 WGMMA a k-step).
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<Int<64>, Int<kTileN>, Int<kTileK>>,
                           GMMA::Major::K, GMMA::Major::K>(),
      Layout<Shape<_2, _1, _1>>{}));

  // A (m, k, batch) row-major gmem view: k contiguous.
  static auto gmem(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tensor(make_gmem_ptr(ptr), make_shape(m, k, batch), make_stride(ld, Int<1>{}, stride));
  }
  static auto tma(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD{}, gmem(ptr, m, k, batch, ld, stride), SmemLayout{}(_, _, 0),
                         make_shape(Int<kTile>{}, Int<kTileK>{}));
  }
  using TmaAtom = decltype(tma(nullptr, 1, 1, 1, 8, 8));
  // B panels: (kTileN, kTileK) boxes.
  static auto tma_b(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD{}, gmem(ptr, m, k, batch, ld, stride), SmemLayoutB{}(_, _, 0),
                         make_shape(Int<kTileN>{}, Int<kTileK>{}));
  }
  using TmaAtomB = decltype(tma_b(nullptr, 1, 1, 1, 8, 8));
  // mc2: the same (kTile, kTileK) panel k-tile, issued as kCluster slices (one per CTA of the
  // cluster, each multicast to every CTA of it).
  static auto tma_mc(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD_MULTICAST{}, gmem(ptr, m, k, batch, ld, stride), SmemLayout{}(_, _, 0),
                         make_shape(Int<kTile>{}, Int<kTileK>{}), Int<kCluster>{});
  }
  using TmaAtomMc = conditional_t<(kCluster > 1), decltype(tma_mc(nullptr, 1, 1, 1, 8, 8)), char>;
  // mc2 with 128×256 units: the shared 256-row B panel's k-tile, as kCluster slices.
  static auto tma_mc_b(const Elem* ptr, int m, int k, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD_MULTICAST{}, gmem(ptr, m, k, batch, ld, stride), SmemLayoutB{}(_, _, 0),
                         make_shape(Int<kTileN>{}, Int<kTileK>{}), Int<kCluster>{});
  }
  using TmaAtomMcB = conditional_t<(kCluster > 1), decltype(tma_mc_b(nullptr, 1, 1, 1, 8, 8)), char>;
  // mc2: empty-barrier arrivals per stage use: lane 0 of each of the 8 consumer warps, of
  // every CTA of the cluster (plain kernel: every consumer thread of the CTA).
  static constexpr int kEmptyArrivals = kCluster > 1 ? kCluster * kNumConsumerThreads / 32 : kNumConsumerThreads;

  // tmastore: the 128×128 output tile in shared memory, 128-byte swizzled (8×64 atoms), the
  // layout of both the C load and the D stores. NOTE: the swizzle makes the accumulator-
  // layout writes of the tile and of its transpose free of bank conflicts.
  using EpiLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                           make_shape(Int<kTile>{}, Int<kTile>{})));
  // D and C as (m, m, batch) TMA views, one 128×128 box per tile (two 128×64 boxes issued).
  static auto tma_store_d(Elem* ptr, int m, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_STORE{},
                         make_tensor(make_gmem_ptr(ptr), make_shape(m, m, batch), make_stride(ld, Int<1>{}, stride)),
                         EpiLayout{}, make_shape(Int<kTile>{}, Int<kTile>{}));
  }
  static auto tma_load_c(const Elem* ptr, int m, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_LOAD{}, gmem(ptr, m, m, batch, ld, stride), EpiLayout{},
                         make_shape(Int<kTile>{}, Int<kTile>{}));
  }
  // Wide tmastore: D stored in 64×64 boxes (SubLayout: the tile buffer holds two, the mirror
  // two), C loaded as two 128×64 boxes (the A panel's box) into a ring stage.
  using SubLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{}, make_shape(Int<64>{}, Int<64>{})));
  using StageLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                              make_shape(Int<kTile>{}, Int<kTileK>{})));
  static auto tma_store_sub(Elem* ptr, int m, int batch, int64_t ld, int64_t stride) {
    return make_tma_atom(SM90_TMA_STORE{},
                         make_tensor(make_gmem_ptr(ptr), make_shape(m, m, batch), make_stride(ld, Int<1>{}, stride)),
                         SubLayout{}, make_shape(Int<64>{}, Int<64>{}));
  }
  using TmaStoreD = conditional_t<kWide, decltype(tma_store_sub(nullptr, 1, 1, 8, 8)),
                                  conditional_t<kTmaStore, decltype(tma_store_d(nullptr, 1, 1, 8, 8)), char>>;
  using TmaLoadC = conditional_t<kWide, TmaAtom, conditional_t<kTmaStore, decltype(tma_load_c(nullptr, 1, 1, 8, 8)), char>>;

  struct SharedStorage {
    alignas(1024) ArrayEngine<Elem, cosize_v<SmemLayout>> a;  // [kStages][kTile, kTileK] swizzled
    alignas(1024) ArrayEngine<Elem, cosize_v<SmemLayoutB>> b;  // [kStages][kTileN, kTileK] swizzled
    alignas(16) Elem epilogue[kEpilogueElems];  // staged only: [kColTiles][kTile, kTile] swizzled
    alignas(1024) Elem tile[kTmaTileElems * kEpiBuffers];    // [kTile, kTile] EpiLayout: C, then D's tile (tmastore)
    alignas(1024) Elem mirror[kTmaTileElems * kEpiBuffers];  // [kTile, kTile] EpiLayout: the tile transposed (tmastore)
    alignas(8) uint64_t full[kStages];   // TMA → consumers: stage loaded
    alignas(8) uint64_t empty[kStages];  // consumers → TMA: stage free
    alignas(8) uint64_t c_full;          // tmastore: TMA → consumers: C tile loaded
    alignas(8) uint64_t epi_empty;       // tmastore: last TMA store has read tile/mirror
    int split_last;                      // split-K: this slice was its tile's last to finish
  };

  struct Params {
    TmaAtom tma_a;
    TmaAtomB tma_b;
    TmaStoreD tma_d;  // tmastore only
    TmaLoadC tma_c;   // tmastore only (D's view when there is no C: never loaded)
    int m, k, batch, num_row_tiles;
    int64_t num_tri, num_work;
    const Elem* c;  // [batch, m, ldc] (may be null when beta == 0)
    int64_t ldc, stride_c;
    Elem* d;        // [batch, m, ldd]
    int64_t ldd, stride_d;
    float alpha, beta;
    // mc2 only (NOTE: last, so that the plain kernel's parameter offsets stay as they were).
    TmaAtomMc tma_am;   // multicast slices of the A panels
    TmaAtomMcB tma_bm;  // multicast slices of the B panels
    PairList pairs;            // the pair list (sm90_sym_pairs.h)
    // Split-K (kCanSplit): units w < num_full are whole units (mc2: pairs); then `split`
    // k-slices of each remaining unit (mc2: of each remaining pair, both units).
    // split == 1: every unit is whole (num_full == num_work).
    int64_t num_full;
    int split;
    int* counters;    // [tail tiles (mc2: 2 a tail pair)] slices finished (zeroed before the launch)
    float* partials;  // [tail tiles][split][16 (n256: 32)][256] float4: each slice's accumulators
  };
};

}  // namespace dmuon::ns::cuda::sm90
