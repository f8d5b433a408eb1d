// dmuon/ns/cuda/sm90_sym_mainloop.cuh — the sm_90a symmetric kernel's main loop: the
// producer/consumer pipeline over a kStages-deep shared-memory ring. One producer thread
// (warpgroup 0) waits for a free stage (empty mbarrier), TMA-loads the A and B k-tiles of
// the current unit into it and arms its full mbarrier with the bytes to expect (mc2: the
// shared panel as one multicast slice from each CTA); the two consumer warpgroups wait on
// the full barrier, run the stage's WGMMAs with one batch kept in flight and release the
// stage once its batch retired. The tmastore epilogue's C loads are scheduled from here too.
// The 2-CTA barrier protocol's invariants I1–I6, cited below: docs/design/sm90_sym_kernel.md.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ns/cuda/sm90_sym_scheduler.cuh"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

// Ring position: stage index and the parity of its current round.
template <int kStages>
struct RingState {
  int index;
  uint32_t phase;
  __device__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// Consumers only (256 threads): named barrier 1 (0 is __syncthreads).
__device__ __forceinline__ void consumer_barrier() {
  asm volatile("bar.sync 1, 256;" ::: "memory");
}

// mc2: lane 0 of every consumer warp, after its warp's WGMMAs on `stage` retired, releases
// the stage in both CTAs of the cluster (invariant I3). Plain kernel: every consumer thread.
template <class T>
__device__ __forceinline__ void release_stage(uint64_t* empty, int stage) {
  if constexpr (T::kCluster > 1) {
    const uint32_t lane0 = (threadIdx.x % 32) == 0;
    CUTE_UNROLL
    for (uint32_t cta = 0; cta < T::kCluster; ++cta) cutlass::arch::ClusterBarrier::arrive(&empty[stage], cta, lane0);
    __syncwarp();  // NOTE: the warp converged again before the next (aligned) WGMMA
  } else {
    cutlass::arch::ClusterBarrier::arrive(&empty[stage]);
  }
}

// mc2 producer: the A and B k-tiles `kt` of one stage use. The shared panel (B for kShareB
// and kShadow units, A for kShareA) as this CTA's slice of it, multicast to both CTAs (the
// peer issues the other slice); the other panel, and both in a kSeparate unit, as plain
// loads of this CTA's own (the caller's partitions).
template <class T, class SmemA, class SmemB, class TAgA, class TAsA, class TBgB, class TBsB>
__device__ __forceinline__ void load_panels_mc2(const typename T::Params& p, PairKind kind, int l, int ti, int tj,
                                                int kt, int stage, const SmemA& sA, const SmemB& sB, uint64_t* full,
                                                const TAgA& tAgA, const TAsA& tAsA, const TBgB& tBgB,
                                                const TBsB& tBsB) {
  constexpr uint16_t kMask = (1u << T::kCluster) - 1;  // every CTA of the cluster: 0b11
  const int rank = static_cast<int>(cute::block_rank_in_cluster());
  // This CTA's slice of panel `row_tile` (`rows` rows, k-tile kt), into both CTAs' stage `stage`.
  auto multicast = [&](const auto& atom, const auto& smem_panels, int row_tile, auto rows) {
    Tensor m = atom.get_tma_tensor(make_shape(p.m, p.k, p.batch));  // (m, k, batch) coords
    Tensor g = local_tile(m(_, _, l), make_shape(rows, Int<T::kTileK>{}),
                          make_coord(row_tile, _));  // (rows, kTileK, k_tiles)
    auto [tg, ts] = tma_partition(atom, rank, Layout<Int<T::kCluster>>{}, group_modes<0, 2>(smem_panels),
                                  group_modes<0, 2>(g));  // (TMA slice, k_tiles), (TMA slice, kStages)
    copy(atom.with(*full, kMask), tg(_, kt), ts(_, stage));
  };
  if (kind == PairKind::kShareA) {
    multicast(p.tma_am, sA, ti, Int<T::kTile>{});
  } else {
    copy(p.tma_a.with(*full), tAgA(_, kt), tAsA(_, stage));
  }
  if (kind == PairKind::kShareB || kind == PairKind::kShadow) {
    multicast(p.tma_bm, sB, tj, Int<T::kTileN>{});  // NOTE: tj: the column block of a 128×256 unit
  } else {
    copy(p.tma_b.with(*full), tBgB(_, kt), tBsB(_, stage));
  }
}

// Wide tmastore: where half `half` (columns 64·half …) of a C tile lies in ring stage
// `stage`: the stage's A panel, or the first 128 rows of its B panel (both 128×64 in
// StageLayoutA, at subtile_index). The producer's loads and the consumers' reads use it both.
template <class T, class Storage>
__device__ __forceinline__ typename T::Element* c_half_in_stage(Storage& smem, int stage, int half) {
  return half == 0 ? smem.a.begin() + stage * T::kTile * T::kTileK : smem.b.begin() + stage * T::kTileN * T::kTileK;
}

// Wide tmastore, producer: the C tiles (row tile u.ti, column tiles 2·u.tj and 2·u.tj + 1)
// of a unit, each as one stage use of the ring: its columns 0–63 into the stage's A panel,
// 64–127 into the first half of its B panel (two 128×64 boxes, 32 KiB of transaction bytes;
// a box outside the matrix is zero-filled and still counts its bytes).
// NOTE: why the ring: the 48 KiB stages leave room beside 4 of them for one 32 KiB epilogue
// buffer only; a C tile in its own buffer would cost a stage. In the ring the loads are
// issued kStages − 1 k-tiles ahead of the epilogue, as the k-tiles are.
template <class T, class Storage>
__device__ __forceinline__ void load_c_slots(const typename T::Params& p, const WorkUnit& u, Storage& smem,
                                             RingState<T::kStages>& state) {
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  Tensor mC = p.tma_c.get_tma_tensor(make_shape(p.m, p.m, p.batch));  // (m, m, batch) coords
  Tensor gC = local_tile(mC(_, _, u.l), make_shape(Int<T::kTile>{}, Int<T::kTileK>{}),
                         make_coord(u.ti, _));  // (kTile, 64, column boxes)
  for (int h = 0; h < T::kColTiles; ++h) {
    EmptyBarrier::wait(&smem.empty[state.index], state.phase);
    FullBarrier::arrive_and_expect_tx(&smem.full[state.index], T::kTileBytes);
    for (int half = 0; half < 2; ++half) {
      Tensor sX = make_tensor(make_smem_ptr(c_half_in_stage<T>(smem, state.index, half)),
                              typename T::StageLayoutA{});  // (kTile, 64)
      auto [tXgC, tXsX] = tma_partition(p.tma_c, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sX),
                                        group_modes<0, 2>(gC));  // (TMA, column boxes), (TMA)
      copy(p.tma_c.with(smem.full[state.index]), tXgC(_, 2 * (T::kColTiles * u.tj + h) + half), tXsX);
    }
    state.advance();
  }
}

// tmastore: the k-tile of a unit (counted from its first) after which the consumers
// release the epilogue tiles (the last tile's TMA stores have read them), and the one after
// whose load the producer loads the next C.
// NOTE: two k-tiles into the next mainloop (chosen, not tuned): 64 KiB of stores
// should have been read by then, and C is requested about num_k_tiles − 3 k-tiles ahead
// of its epilogue. The measured gain of the whole epilogue: sm90_sym_instances.def.
__device__ __forceinline__ int epilogue_release_k_tile(const WorkUnit& u) {
  return u.k_begin + std::min(2, u.k_end - u.k_begin - 1);
}
template <class T>
__device__ __forceinline__ int c_load_k_tile(const WorkUnit& u) {
  return u.k_begin + std::min(T::kStages + 2, u.k_end - u.k_begin - 1);
}

// Producer (one thread): walks the CTA's work list (from work_begin, every work_step) and
// fills the ring with each unit's k-tiles; tmastore with β·C also loads each unit's C tile.
template <class T, class Storage, class SmemA, class SmemB>
__device__ __forceinline__ void produce(const typename T::Params& p, Storage& smem, const SmemA& sA, const SmemB& sB,
                                        int num_k_tiles, int64_t work_begin, int64_t work_step, bool with_c) {
  constexpr int kTile = T::kTile, kTileK = T::kTileK, kTileN = T::kTileN, kStages = T::kStages;
  constexpr int kCluster = T::kCluster;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  Tensor mA = p.tma_a.get_tma_tensor(make_shape(p.m, p.k, p.batch));  // (m, k, batch) coords
  Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.m, p.k, p.batch));  // (m, k, batch) coords
  const auto tile_mk = make_shape(Int<kTile>{}, Int<kTileK>{});
  const auto tile_nk = make_shape(Int<kTileN>{}, Int<kTileK>{});
  const auto tile_mm = make_shape(Int<kTile>{}, Int<kTile>{});
  RingState<kStages> state{0, 1u};  // NOTE: parity 1 — the first round finds every stage free.
  uint32_t epi_phase = 1u;          // tmastore: likewise, the first C load finds the tile free
  for (int64_t w = work_begin; w < p.num_work; w += work_step) {
    const WorkUnit u = decode_work<T>(p, w, num_k_tiles);
    const int l = u.l, ti = u.ti, tj = u.tj;
    const int c_kt = c_load_k_tile<T>(u);
    Tensor gA = local_tile(mA(_, _, l), tile_mk, make_coord(ti, _));  // (kTile, kTileK, k_tiles)
    Tensor gB = local_tile(mB(_, _, l), tile_nk, make_coord(tj, _));  // (kTileN, kTileK, k_tiles)
    auto [tAgA, tAsA] = tma_partition(p.tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA),
                                      group_modes<0, 2>(gA));  // (TMA, k_tiles), (TMA, kStages)
    auto [tBgB, tBsB] = tma_partition(p.tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB),
                                      group_modes<0, 2>(gB));  // (TMA, k_tiles), (TMA, kStages)
    for (int kt = u.k_begin; kt < u.k_end; ++kt) {
      EmptyBarrier::wait(&smem.empty[state.index], state.phase);
      FullBarrier::arrive_and_expect_tx(&smem.full[state.index], T::kTxBytes);
      if constexpr (kCluster > 1) {
        // mc2: the shared panel as this CTA's slice, multicast to both CTAs (I2, I3).
        load_panels_mc2<T>(p, u.kind, l, ti, tj, kt, state.index, sA, sB, &smem.full[state.index], tAgA, tAsA,
                           tBgB, tBsB);
      } else {
        copy(p.tma_a.with(smem.full[state.index]), tAgA(_, kt), tAsA(_, state.index));
        copy(p.tma_b.with(smem.full[state.index]), tBgB(_, kt), tBsB(_, state.index));
      }
      state.advance();
      // tmastore with β·C: the C tile into the epilogue tile once the last stores read it.
      // NOTE: mc2: not for a tile this CTA only shadows (its epilogue is skipped too, I6).
      // Split-K: for every slice (which one finishes last is not known yet).
      if constexpr (T::kTmaStore && !T::kWide) {
        if (with_c && kt == c_kt && u.writes) {
          EmptyBarrier::wait(&smem.epi_empty, epi_phase);
          epi_phase ^= 1u;
          Tensor sC = make_tensor(make_smem_ptr(smem.tile), typename T::EpiLayout{});  // (kTile, kTile)
          Tensor mC = p.tma_c.get_tma_tensor(make_shape(p.m, p.m, p.batch));          // (m, m, batch) coords
          Tensor gC = local_tile(mC(_, _, l), tile_mm, make_coord(ti, tj));            // (kTile, kTile)
          auto [tCgC, tCsC] = tma_partition(p.tma_c, group_modes<0, 2>(sC), group_modes<0, 2>(gC));
          FullBarrier::arrive_and_expect_tx(&smem.c_full, T::kTileBytes);
          copy(p.tma_c.with(smem.c_full), tCgC, tCsC);
        }
      }
    }
    // Wide tmastore with β·C: the C tile of each column tile of the unit as one more
    // stage use of the ring, after the unit's k-tiles (both CTAs of a cluster, lockstep I1).
    if constexpr (T::kWide) {
      if (with_c) load_c_slots<T>(p, u, smem, state);
    }
  }
}

// Consumers (256 threads), one unit: the WGMMAs over its k-tiles [u.k_begin, u.k_end) into
// `acc`, one batch kept in flight, each stage released once its batch retired; tmastore:
// the epilogue tiles freed at epilogue_release_k_tile once the last stores read them.
template <class T, class Mma, class FragA, class FragB, class Acc, class Storage>
__device__ __forceinline__ void consume_k_tiles(Mma& mma, const FragA& tCrA, const FragB& tCrB, Acc& acc,
                                                Storage& smem, const WorkUnit& u, RingState<T::kStages>& state,
                                                bool& store_pending) {
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  [[maybe_unused]] const int release_at = epilogue_release_k_tile(u);
  // Main loop: keep one WGMMA batch in flight; free a stage once its batch retired.
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  int prev_stage = -1;
  for (int kt = u.k_begin; kt < u.k_end; ++kt) {
    FullBarrier::wait(&smem.full[state.index], state.phase);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      cute::gemm(mma, tCrA(_, _, kb, state.index), tCrB(_, _, kb, state.index), acc);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc);
    if (prev_stage >= 0) release_stage<T>(smem.empty, prev_stage);
    prev_stage = state.index;
    state.advance();
    // tmastore: once the last tile's stores have read the epilogue tiles, free them.
    if constexpr (T::kTmaStore && !T::kWide) {
      if (kt == release_at) {
        if (store_pending) {
          tma_store_wait<0>();
          EmptyBarrier::arrive(&smem.epi_empty);
          store_pending = false;
        }
        __syncwarp();  // NOTE: warp 0 converged again before the next (aligned) WGMMA
      }
    }
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  release_stage<T>(smem.empty, prev_stage);
}

}  // namespace dmuon::ns::cuda::sm90
