// dmuon/ns/cuda/sm90_sym_kernel.cuh — the sm_90a symmetric-product kernel template
// D = α·A·Bᵀ + β·C with a symmetric result: a persistent, warp-specialized kernel in which
// warpgroup 0's producer thread fills a shared-memory ring by TMA and two consumer warpgroups
// run the WGMMAs and the epilogue of each lower-triangle unit, writing it and its mirror.
// This file composes the parts, one header each (as DeepGEMM splits its kernels):
// sm90_sym_traits.cuh (shape, storage, parameters), sm90_sym_scheduler.cuh (which unit
// next), sm90_sym_mainloop.cuh (the pipeline), sm90_sym_epilogue.cuh (accumulators to D);
// sm90_sym_launch.cuh launches it. The design, its variants (128×256 units, 2-CTA clusters,
// tail split-K) and the cluster barrier protocol (I1–I6): docs/design/sm90_sym_kernel.md.
#pragma once

#include "ns/cuda/sm90_sym_epilogue.cuh"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

template <class Elem, int kStages, int kEpi, int kCluster, int kTileN>
__global__ void __launch_bounds__(Traits<Elem, kStages, kEpi, kCluster, kTileN>::kNumThreads, 1)
    sym_product_kernel(CUTE_GRID_CONSTANT const typename Traits<Elem, kStages, kEpi, kCluster, kTileN>::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Traits<Elem, kStages, kEpi, kCluster, kTileN>;
  constexpr int kTile = T::kTile, kTileK = T::kTileK;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;

  extern __shared__ char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  const int warpgroup_idx = threadIdx.x / 128;

  // Barrier set-up, visible to the async proxy before any TMA.
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&smem.full[s], 1);
      EmptyBarrier::init(&smem.empty[s], T::kEmptyArrivals);
    }
    if constexpr (T::kTmaStore) {
      FullBarrier::init(&smem.c_full, 1);
      EmptyBarrier::init(&smem.epi_empty, 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  // mc2: both CTAs' barriers initialized before any remote arrive or multicast (I5).
  if constexpr (kCluster > 1) {
    cute::cluster_sync();
  } else {
    __syncthreads();
  }

  Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), typename T::SmemLayout{});  // (kTile, kTileK, kStages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), typename T::SmemLayoutB{});  // (kTileN, kTileK, kStages)
  const int num_k_tiles = (p.k + kTileK - 1) / kTileK;
  const bool with_c = p.beta != 0.f;
  // Work list (p.num_work units): tiles × batch, strided over CTAs; mc2: pair units, strided
  // over clusters; then split-K's tail slices.
  const int64_t work_begin = blockIdx.x / kCluster, work_step = gridDim.x / kCluster;

  if (warpgroup_idx == 0) {
    // Producer: one thread walks the same work list and fills the ring.
    // NOTE: registers move from the producer warpgroup to the consumers (CUTLASS's 40/232
    // split): the consumers hold 64 fp32 accumulators plus the epilogue's state.
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) produce<T>(p, smem, sA, sB, num_k_tiles, work_begin, work_step, with_c);
    // mc2: no early exit (I5): the producer warpgroup joins the final cluster_sync.
    if constexpr (kCluster > 1) {
      __syncwarp();
      cute::cluster_sync();
    }
    return;
  }

  // Consumers: WGMMA over the ring, then the epilogue.
  cutlass::arch::warpgroup_reg_alloc<232>();
  typename T::TiledMma mma;
  const int consumer_idx = threadIdx.x - 128;
  auto thr_mma = mma.get_thread_slice(consumer_idx);
  Tensor tCsA = thr_mma.partition_A(sA);              // (MMA, MMA_M, MMA_K, kStages)
  Tensor tCsB = thr_mma.partition_B(sB);              // (MMA, MMA_N, MMA_K, kStages)
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);        // smem descriptors
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);        // smem descriptors
  // NOTE: n256: accumulators [kTileValues·h, kTileValues·(h + 1)) are column tile h of the
  // unit (checked on the host: fragment_tiles_split_by_column, before the first launch).
  Tensor cD = make_identity_tensor(make_shape(Int<kTile>{}, Int<kTileN>{}));  // (kTile, kTileN) → (r, c)
  Tensor tCcD = thr_mma.partition_C(cD);              // (MMA, MMA_M, MMA_N) coords
  Tensor acc = partition_fragment_C(mma, make_shape(Int<kTile>{}, Int<kTileN>{}));  // (MMA, MMA_M, MMA_N) fp32

  RingState<kStages> state{0, 0u};
  bool store_pending = false;  // tmastore, consumer 0: TMA stores in flight from the epilogue tiles
  int epi_seq = 0;             // wide tmastore: subtiles written so far (picks the buffer pair)
  uint32_t c_phase = 0u;       // tmastore: parity of the next C load
  for (int64_t w = work_begin; w < p.num_work; w += work_step) {
    const WorkUnit u = decode_work<T>(p, w, num_k_tiles);
    consume_k_tiles<T>(mma, tCrA, tCrB, acc, smem, u, state, store_pending);
    // Wide tmastore: its own epilogue, which also takes the C stage uses (writing or not).
    // Split-K: a slice first publishes its accumulators; only the tile's last slice writes
    // (a shadow unit's rank 1 neither writes nor counts).
    if constexpr (T::kWide) {
      bool writes = u.writes;
      if constexpr (T::kCanSplit) {
        if (u.part >= 0 && u.writes) writes = split_k_reduce<T>(p, u, consumer_idx, acc, &smem.split_last);
      }
      wide_tmastore_epilogue<T>(p, u, with_c, writes, consumer_idx, acc, smem, state, store_pending, epi_seq);
      continue;
    }
    // mc2: rank 1 of a shadow unit only kept the barrier protocol going (I6).
    if constexpr (kCluster > 1) {
      if (!u.writes) continue;
    }
    // Split-K: publish this slice; the tile's last slice to finish sums them and goes on.
    // NOTE: compiled into the instances that can split only (Traits::kCanSplit; the wide one
    // split above).
    if constexpr (T::kCanSplit) {
      if (u.part >= 0) {
        if (!split_k_reduce<T>(p, u, consumer_idx, acc, &smem.split_last)) {
          // NOTE: the producer loaded C for this slice too; take the load (parity) and free
          // the epilogue tile for the next one (one epi_empty arrival per C load).
          if (with_c) {
            FullBarrier::wait(&smem.c_full, c_phase);
            c_phase ^= 1u;
            if (consumer_idx == 0) EmptyBarrier::arrive(&smem.epi_empty);
          }
          continue;
        }
      }
    }

    // NOTE: n256: the accumulators' coordinates are derived again in each unit. From tCcD
    // the compiler computed the 128 shared-memory offsets of the staged epilogue once, before
    // the work loop, and kept them across it (ptxas -v, nvcc 13: 828 bytes of spills).
    auto tEcD = [&] {
      if constexpr (T::kColTiles > 1) {
        return mma.get_thread_slice(opaque(consumer_idx)).partition_C(cD);  // (MMA, MMA_M, MMA_N) coords
      } else {
        return tCcD;
      }
    }();
    if constexpr (T::kWide) {
      // (its epilogue ran above)
    } else if constexpr (T::kTmaStore) {
      tmastore_epilogue<T>(p, u, with_c, consumer_idx, acc, smem, c_phase, store_pending);
    } else if constexpr (!T::kStaged) {
      direct_epilogue<T>(p, u, acc, tEcD);
    } else {
      staged_epilogue<T>(p, u, consumer_idx, acc, tEcD, smem);
    }
  }
  // tmastore: shared memory must outlive the last TMA stores' reads.
  if constexpr (T::kTmaStore) {
    if (store_pending) tma_store_wait<0>();
  }
  // mc2: no CTA exits while its peer may still arrive on its barriers (I5).
  if constexpr (kCluster > 1) {
    __syncwarp();
    cute::cluster_sync();
  }
#endif
}

}  // namespace dmuon::ns::cuda::sm90
