// dmuon/ns/cuda/sm90_sym_pingpong.cuh — the sm_90a symmetric product with ping-pong consumers
// ("pp-tmastore"): the 1-CTA 128×128 tmastore kernel of sm90_sym_kernel.cuh, except that each
// consumer warpgroup computes whole tiles and the two take the CTA's units in turn, so that
// one warpgroup's epilogue runs while the other's WGMMAs keep the tensor cores busy.
//
//   warpgroup 0   producer: one thread fills the ring with each unit's A and B k-panels, in
//                 unit order; with β·C, after a unit's k-tiles, its C tile into the epilogue
//                 buffers of the unit's warpgroup once their last stores have read them;
//   warpgroups 1–2 consumers: unit n of the CTA (n = 0, 1, …) is warpgroup n % 2's: two
//                 64×128×16 WGMMAs a k-step (the 128×128 tile, 128 fp32 accumulators a thread),
//                 then the tmastore epilogue in 8×8 blocks on the warpgroup's 128 threads, into
//                 the warpgroup's own tile and mirror buffers; one thread issues their TMA
//                 stores, waits until the stores have read them and releases them.
// Work, tiles, the epilogue's blocks and the mirror are those of the plain kernel (its header).
// Invariants:
//   P1 the ring is filled in unit order; a stage use is waited for and released by the 128
//      threads of the warpgroup whose unit it belongs to (empty count 128). A warpgroup steps
//      its ring position over the other's units without waiting.
//   P2 mainloop order: unit n's warpgroup waits for its first stage use only after unit
//      n − 1's warpgroup has passed its last full-barrier wait (the `order` barrier, one phase
//      a unit). NOTE: a parity wait is only sound on the barrier's current phase or the one
//      before it. Without the order a warpgroup that stepped over the other's uses could wait
//      for stage use u while the stage's previous use (u − kStages) was still pending, read
//      the parity as complete and take a stage that was not loaded (seen on an H200: a launch
//      failure once CTAs ran several units). With it, every use before u has been waited for.
//   P3 warpgroup g's epilogue buffers (tile[g], mirror[g]) are touched by its own threads and
//      the TMA unit only. Its epilogue starts with a barrier of its 128 threads, after its
//      storing thread waited for the last stores' reads; with β·C the producer loads the next
//      C tile once that thread released the buffers (epi_empty[g]), and the warpgroup waits
//      for it (c_full[g]). Both complete one phase per unit of the warpgroup.
//   P4 no deadlock: the producer waits on epi_empty[g] for unit n only after issuing unit n's
//      k-tiles; the release it waits for (unit n − 2's) needs nothing it issues later.
// NOTE: why a buffer pair per warpgroup: with one pair handed from one warpgroup to the other
// through mbarriers (correct by the memory model: arrive releases, wait acquires), racecheck
// reported every hand-over as a hazard (it orders shared-memory accesses by bar.sync), and the
// two epilogues waited for each other's stores. The pairs take two 32 KiB stages: s3 only.
// NOTE: why the C load after the unit's k-tiles (the plain kernel loads it kStages + 2 k-tiles
// in): the producer then waits for a release only while the warpgroup that gives it has no
// k-tiles in the ring, so the other warpgroup's mainloop is never starved.
// NOTE: why: the β·C products of the Gram iteration have k = m (896: 14 k-tiles a tile, 1536:
// 24), near the ridge point, where the cooperative kernel's tensor cores idle through every
// tile's epilogue (BENCHMARKS.md run M: the symmetric kernel at 62% of its floor at 1.5B).
#pragma once

#include "ns/cuda/sm90_sym_kernel.cuh"

namespace dmuon::ns::cuda::sm90 {

// Compile-time shape: the plain 1-CTA tmastore kernel's (layouts, TMA atoms, shared storage,
// parameters), with one consumer warpgroup per 128×128 tile.
template <class Elem, int kStagesT>
struct PingPongTraits : Traits<Elem, kStagesT, static_cast<int>(Sm90Epilogue::kTmaStore)> {
  using Base = Traits<Elem, kStagesT, static_cast<int>(Sm90Epilogue::kTmaStore)>;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kEmptyArrivals = kWarpgroupThreads;  // P1: the owning warpgroup's threads
  // One warpgroup: 64×128×16 atoms, two of them over the tile's 128 rows.
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<Int<64>, Int<128>, Int<64>>, GMMA::Major::K,
                           GMMA::Major::K>(),
      Layout<Shape<_1, _1, _1>>{}));
  static constexpr int kTileValues = Base::kTile * Base::kTile / kWarpgroupThreads;  // 128
  static constexpr int kTileElems = Base::kTile * Base::kTile;
  struct SharedStorage {
    alignas(1024) ArrayEngine<Elem, cosize_v<typename Base::SmemLayout>> a;  // [kStages][kTile, kTileK] swizzled
    alignas(1024) ArrayEngine<Elem, cosize_v<typename Base::SmemLayout>> b;  // [kStages][kTile, kTileK] swizzled
    alignas(1024) Elem tile[2][kTileElems];    // per warpgroup, EpiLayout: C, then D's tile
    alignas(1024) Elem mirror[2][kTileElems];  // per warpgroup, EpiLayout: the tile transposed
    alignas(8) uint64_t full[kStagesT];   // TMA → consumers: stage loaded
    alignas(8) uint64_t empty[kStagesT];  // consumers → TMA: stage free
    alignas(8) uint64_t c_full[2];        // TMA → warpgroup g: C tile loaded (P3)
    alignas(8) uint64_t epi_empty[2];     // warpgroup g → TMA: its last stores read its buffers (P3)
    alignas(8) uint64_t order;            // P2: unit n's warpgroup passed its last full-barrier wait
  };
};

// Whether every thread of a consumer warpgroup holds the tile's accumulators in the layout the
// epilogue assumes: value v at row 64·(v/64) + 16·warp + 8·((v/2)%2) + lane/4 and column
// 8·((v%64)/4) + 2·(lane%4) + v%2 (the plain kernel's layout, once per 64-row atom).
template <class T>
bool pingpong_fragment_is_mma_layout() {
  return every_accumulator<T>(T::kTileValues, [](int thread, int v, int row, int col) {
    const int warp = thread / 32, lane = thread % 32, w = v % 64;
    return row == 64 * (v / 64) + 16 * warp + 8 * ((w / 2) % 2) + lane / 4 &&
           col == 8 * (w / 4) + 2 * (lane % 4) + w % 2;
  });
}

// Consumer warpgroup `g` only (128 threads): named barrier 2 + g (0 is __syncthreads, 1 the
// cooperative kernel's).
__device__ __forceinline__ void warpgroup_barrier(int g) {
  asm volatile("bar.sync %0, 128;" ::"r"(2 + g) : "memory");
}

// Ring position advanced over `n` stage uses (the other warpgroup's unit, P1).
template <int kStages>
__device__ __forceinline__ void skip_uses(RingState<kStages>& state, int n) {
  const int to = state.index + n;
  state.phase ^= static_cast<uint32_t>((to / kStages) & 1);
  state.index = to % kStages;
}

template <class Elem, int kStages>
__global__ void __launch_bounds__(PingPongTraits<Elem, kStages>::kNumThreads, 1)
    sym_pingpong_kernel(CUTE_GRID_CONSTANT const typename PingPongTraits<Elem, kStages>::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = PingPongTraits<Elem, kStages>;
  using Base = typename T::Base;
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
    for (int g = 0; g < 2; ++g) {
      FullBarrier::init(&smem.c_full[g], 1);
      EmptyBarrier::init(&smem.epi_empty[g], 1);
    }
    EmptyBarrier::init(&smem.order, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), typename T::SmemLayout{});  // (kTile, kTileK, kStages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), typename T::SmemLayoutB{});  // (kTile, kTileK, kStages)
  const int num_k_tiles = (p.k + kTileK - 1) / kTileK;
  const auto tile_mm = make_shape(Int<kTile>{}, Int<kTile>{});
  const bool with_c = p.beta != 0.f;
  const int64_t work_begin = blockIdx.x, work_step = gridDim.x;

  if (warpgroup_idx == 0) {
    // Producer: one thread walks the CTA's units and fills the ring (P1), then C (P3, P4).
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      Tensor mA = p.tma_a.get_tma_tensor(make_shape(p.m, p.k, p.batch));  // (m, k, batch) coords
      Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.m, p.k, p.batch));  // (m, k, batch) coords
      const auto tile_mk = make_shape(Int<kTile>{}, Int<kTileK>{});
      RingState<kStages> state{0, 1u};  // NOTE: parity 1 — the first round finds every stage free.
      // Likewise each warpgroup's first C load finds its buffers free: bit g, epi_empty[g]'s
      // parity. NOTE: bits of one register, not an array indexed by g (local memory).
      uint32_t epi_phases = 0b11u;
      int n = 0;
      for (int64_t w = work_begin; w < p.num_work; w += work_step, ++n) {
        const WorkUnit u = decode_work<Base>(p, w, num_k_tiles);
        Tensor gA = local_tile(mA(_, _, u.l), tile_mk, make_coord(u.ti, _));  // (kTile, kTileK, k_tiles)
        Tensor gB = local_tile(mB(_, _, u.l), tile_mk, make_coord(u.tj, _));  // (kTile, kTileK, k_tiles)
        auto [tAgA, tAsA] = tma_partition(p.tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA),
                                          group_modes<0, 2>(gA));  // (TMA, k_tiles), (TMA, kStages)
        auto [tBgB, tBsB] = tma_partition(p.tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB),
                                          group_modes<0, 2>(gB));  // (TMA, k_tiles), (TMA, kStages)
        for (int kt = u.k_begin; kt < u.k_end; ++kt) {
          EmptyBarrier::wait(&smem.empty[state.index], state.phase);
          FullBarrier::arrive_and_expect_tx(&smem.full[state.index], T::kTxBytes);
          copy(p.tma_a.with(smem.full[state.index]), tAgA(_, kt), tAsA(_, state.index));
          copy(p.tma_b.with(smem.full[state.index]), tBgB(_, kt), tBsB(_, state.index));
          state.advance();
        }
        if (with_c) {
          const int g = n & 1;  // the unit's warpgroup
          EmptyBarrier::wait(&smem.epi_empty[g], (epi_phases >> g) & 1u);
          epi_phases ^= 1u << g;
          Tensor sC = make_tensor(make_smem_ptr(smem.tile[g]), typename T::EpiLayout{});  // (kTile, kTile)
          Tensor mC = p.tma_c.get_tma_tensor(make_shape(p.m, p.m, p.batch));             // (m, m, batch) coords
          Tensor gC = local_tile(mC(_, _, u.l), tile_mm, make_coord(u.ti, u.tj));         // (kTile, kTile)
          auto [tCgC, tCsC] = tma_partition(p.tma_c, group_modes<0, 2>(sC), group_modes<0, 2>(gC));
          FullBarrier::arrive_and_expect_tx(&smem.c_full[g], T::kTileBytes);
          copy(p.tma_c.with(smem.c_full[g]), tCgC, tCsC);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup g runs the units n with n % 2 == g.
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int g = warpgroup_idx - 1;
  const int thread = threadIdx.x % 128;  // within the warpgroup
  typename T::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(thread);
  Tensor tCsA = thr_mma.partition_A(sA);        // (MMA, MMA_M, MMA_K, kStages)
  Tensor tCsB = thr_mma.partition_B(sB);        // (MMA, MMA_N, MMA_K, kStages)
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);  // smem descriptors
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);  // smem descriptors
  Tensor acc = partition_fragment_C(mma, tile_mm);  // (MMA, MMA_M = 2, MMA_N = 1) fp32
  Tensor sT = make_tensor(make_smem_ptr(smem.tile[g]), typename T::EpiLayout{});    // (kTile, kTile)
  Tensor sM = make_tensor(make_smem_ptr(smem.mirror[g]), typename T::EpiLayout{});  // (kTile, kTile)
  Elem* tile = smem.tile[g];      // [kTile, kTile] at tma_tile_index (= sT's layout)
  Elem* mirror = smem.mirror[g];  // [kTile, kTile] at tma_tile_index (= sM's layout)
  const int warp = thread / 32, lane = thread % 32;
  const int quad = lane / 8, sub = lane % 8;  // the block this lane addresses, and its row

  RingState<kStages> state{0, 0u};
  // Parities: `order` completes once a unit (P2; 1: unit 0 finds it free, the phase "before"
  // a fresh barrier's first counts as complete), c_full[g] once a unit of this warpgroup (P3).
  uint32_t order_phase = 1u, c_phase = 0u;
  int n = 0;
  for (int64_t w = work_begin; w < p.num_work; w += work_step, ++n) {
    const WorkUnit u = decode_work<Base>(p, w, num_k_tiles);
    if ((n & 1) != g) {
      skip_uses(state, u.k_end - u.k_begin);
      order_phase ^= 1u;
      continue;
    }

    // Main loop: keep one WGMMA batch in flight; free a stage once its batch retired.
    // After the unit's last full-barrier wait, hand the ring over to the next unit (P2).
    EmptyBarrier::wait(&smem.order, order_phase);
    order_phase ^= 1u;
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    int prev_stage = -1;
    for (int kt = u.k_begin; kt < u.k_end; ++kt) {
      FullBarrier::wait(&smem.full[state.index], state.phase);
      if (kt == u.k_end - 1) {
        if (thread == 0) EmptyBarrier::arrive(&smem.order);
        __syncwarp();  // NOTE: warp 0 converged again before the (aligned) WGMMA
      }
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
      if (prev_stage >= 0) EmptyBarrier::arrive(&smem.empty[prev_stage]);
      prev_stage = state.index;
      state.advance();
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    EmptyBarrier::arrive(&smem.empty[prev_stage]);

    // Epilogue, pass 1: this warpgroup's buffers free (P3: its storing thread waited for the
    // last stores' reads before the barrier; with C, C loaded), then α·acc + β·C in fp32,
    // rounded once, into the tile (over C) and transposed into the mirror, in 8×8 blocks:
    // warp w holds rows 64·a + 16w … of atom a (a = 0, 1); accumulator 64a + 8·jj + 2q is
    // the block at rows 64a + 16w + 8·(q%2) …, columns 8·(2·jj + q/2) … (see load_blocks_x4).
    // A warp reads and writes only its own rows of the tile.
    if (with_c) {
      FullBarrier::wait(&smem.c_full[g], c_phase);
      c_phase ^= 1u;
    }
    warpgroup_barrier(g);
    const int ti = u.ti, tj = u.tj;
    const bool diagonal = ti == tj;
    CUTE_UNROLL
    for (int a = 0; a < 2; ++a) {
      const int row0 = 64 * a + 16 * warp + 8 * (quad % 2);
      CUTE_UNROLL
      for (int jj = 0; jj < 8; ++jj) {
        const int col = 8 * (2 * jj + quad / 2);
        Elem* at = tile + tma_tile_index(row0 + sub, col);
        uint32_t c_pairs[4] = {0u, 0u, 0u, 0u}, out[4];
        if (with_c) load_blocks_x4(at, c_pairs);
        CUTE_UNROLL
        for (int q = 0; q < 4; ++q) {
          float lo = p.alpha * acc(64 * a + 8 * jj + 2 * q), hi = p.alpha * acc(64 * a + 8 * jj + 2 * q + 1);
          if (with_c) {
            lo += p.beta * low_of<Elem>(c_pairs[q]);
            hi += p.beta * high_of<Elem>(c_pairs[q]);
          }
          out[q] = pack_pair<Elem>(lo, hi);
        }
        store_blocks_x4(at, out);
        store_blocks_x4_transposed(mirror + tma_tile_index(col + sub, row0), out);
      }
    }
    // A diagonal tile takes its lower triangle's values in both halves (as the plain kernel).
    if (diagonal) {
      warpgroup_barrier(g);  // NOTE: every warp's mirror blocks are written
      constexpr int kChunks = kTile * kTile / 8;
      for (int q = thread; q < kChunks; q += T::kWarpgroupThreads) {
        const int r = q / (kTile / 8), c0 = 8 * (q % (kTile / 8));
        if (c0 + 7 <= r) continue;  // no element above the diagonal
        take_above_diagonal(reinterpret_cast<uint4*>(tile + tma_tile_index(r, c0)),
                            reinterpret_cast<const uint4*>(mirror + tma_tile_index(r, c0)), r, c0);
      }
    }
    tma_store_fence();  // the generic-proxy writes, visible to the TMA unit
    warpgroup_barrier(g);

    // Pass 2: one thread stores the tile and the mirror (clipped at m × m), waits until the
    // stores have read them and frees the buffers for this warpgroup's next unit (P3).
    if (thread == 0) {
      Tensor mD = p.tma_d.get_tma_tensor(make_shape(p.m, p.m, p.batch));  // (m, m, batch) coords
      Tensor gD = local_tile(mD(_, _, u.l), tile_mm, make_coord(ti, tj));  // (kTile, kTile)
      auto [tDgD, tDsT] = tma_partition(p.tma_d, group_modes<0, 2>(sT), group_modes<0, 2>(gD));
      copy(p.tma_d, tDsT, tDgD);
      if (!diagonal) {
        Tensor gM = local_tile(mD(_, _, u.l), tile_mm, make_coord(tj, ti));  // (kTile, kTile)
        auto [tMgM, tMsM] = tma_partition(p.tma_d, group_modes<0, 2>(sM), group_modes<0, 2>(gM));
        copy(p.tma_d, tMsM, tMgM);
      }
      tma_store_arrive();
      tma_store_wait<0>();
      EmptyBarrier::arrive(&smem.epi_empty[g]);
    }
    __syncwarp();  // NOTE: warp 0 converged again before the next (aligned) WGMMA
  }
#endif
}

// Host launch of one instance (requirements checked by the caller: sym_config_applies).
template <class Elem, int kStages>
void launch_pingpong(const SymProductArgs& args, int num_ctas, cudaStream_t stream) {
  using T = PingPongTraits<Elem, kStages>;
  static const bool mma_layout = pingpong_fragment_is_mma_layout<T>();
  DMUON_CHECK(mma_layout, "sm90_sym_product: the ping-pong accumulator fragment is not the mma layout its "
                          "epilogue assumes (CuTe layout changed?)");
  const typename T::Params p = make_params<typename T::Base>(args);
  auto kernel = sym_pingpong_kernel<Elem, kStages>;
  static_assert(sizeof(typename T::SharedStorage) <= 227 * 1024, "over the 227 KiB shared-memory opt-in");
  const int smem_bytes = static_cast<int>(sizeof(typename T::SharedStorage));
  int device = 0, num_sms = 0;
  DMUON_CHECK_CUDA(cudaGetDevice(&device));
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, device);
  DMUON_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t ctas = num_ctas > 0 ? std::min<int64_t>(num_ctas, num_sms) : num_sms;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.num_work, ctas));
  kernel<<<grid, T::kNumThreads, smem_bytes, stream>>>(p);
  DMUON_CHECK_CUDA(cudaGetLastError());
}

// The built ping-pong instance of one element type (s3); false when not built.
template <class Elem>
bool launch_pingpong_instance(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  if (!config.pingpong || config.cluster != 1 || config.tile_n != 128 || config.split_k ||
      config.epilogue != Sm90Epilogue::kTmaStore || config.stages != 3)
    return false;
  launch_pingpong<Elem, 3>(args, config.num_ctas, stream);
  return true;
}

}  // namespace dmuon::ns::cuda::sm90
