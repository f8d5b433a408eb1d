// dmuon/ns/cuda/sm90_sym_kernel.cuh — the sm_90a symmetric-product kernel template
// D = α·A·Bᵀ + β·C with a symmetric result. Included by one .cu per element type
// (sm90_sym_product_{f16,bf16}.cu) so the instances compile in parallel.
//
// Persistent, warp-specialized kernel (CuTe primitives from the CUTLASS headers):
//   warpgroup 0   producer: one thread issues TMA loads of the A and B k-panels of each
//                 work tile into a kStages-deep shared-memory ring (full/empty mbarriers);
//   warpgroups 1–2 consumers: WGMMA 64×128×16 each (the two stacked make a 128×128 tile),
//                 fp32 accumulators, one WGMMA batch kept in flight; then the epilogue.
// Work = (lower-triangle tile (i ≥ j), batch index), enumerated tile-major within each
// matrix so that neighbouring CTAs share A/B panels in L2; each CTA strides over the work
// list (grid = number of SMs unless configured). Each output element is written exactly
// once and D is exactly symmetric (the value of (r, c), r ≥ c, is also stored at (c, r)).
// NOTE: exact symmetry matters: the antisymmetric part of the rounding error otherwise
// grows through the Gram iteration (see the NOTE in csrc/torch/aten_ns_backend.h).
//
// Two epilogues (template flag kStaged):
//   direct  each thread forms α·acc + β·C in fp32 and stores the 16-bit value and its
//           mirror straight from the accumulator layout (2-byte, strided mirror stores);
//   staged  the rounded tile goes to a swizzled shared-memory tile first; then 16-byte
//           coalesced stores of the rows and of the transposed rows (the mirror).
#pragma once

// NOTE: cute/tensor.hpp must come first (the atom headers assume its declarations).
#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "ns/cuda/cuda_check.h"
#include "ns/cuda/sm90_sym_product.h"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

// Compile-time shape of the kernel.
// NOTE: 128×128×64 tiles are 32 KiB a stage; 64 fp32 accumulators per consumer thread;
// one CTA per SM. Square tiles keep diagonal tiles aligned with the triangle. The staged
// epilogue adds a 32 KiB 16-bit tile, so it fits up to 6 stages (227 KiB limit).
template <class Elem, int kStagesT, bool kStagedT>
struct Traits {
  static constexpr int kTile = 128;
  static constexpr int kTileK = 64;
  static constexpr int kStages = kStagesT;
  static constexpr bool kStaged = kStagedT;
  static constexpr int kNumConsumerThreads = 256;
  static constexpr int kNumThreads = 128 + kNumConsumerThreads;
  static constexpr int kTxBytes = 2 * kTile * kTileK * static_cast<int>(sizeof(Elem));
  static constexpr int kEpilogueElems = kStaged ? kTile * kTile : 8;

  using SmemLayout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Elem>{},
                                            make_shape(Int<kTile>{}, Int<kTileK>{}, Int<kStages>{})));
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Elem, Elem, float, Shape<Int<64>, Int<kTile>, Int<kTileK>>,
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

  struct SharedStorage {
    alignas(1024) ArrayEngine<Elem, cosize_v<SmemLayout>> a;  // [kStages][kTile, kTileK] swizzled
    alignas(1024) ArrayEngine<Elem, cosize_v<SmemLayout>> b;  // [kStages][kTile, kTileK] swizzled
    alignas(16) Elem epilogue[kEpilogueElems];                // [kTile, kTile] swizzled (staged only)
    alignas(8) uint64_t full[kStages];   // TMA → consumers: stage loaded
    alignas(8) uint64_t empty[kStages];  // consumers → TMA: stage free
  };

  struct Params {
    TmaAtom tma_a, tma_b;
    int m, k, batch, num_row_tiles;
    int64_t num_tri, num_work;
    const Elem* c;  // [batch, m, ldc] (may be null when beta == 0)
    int64_t ldc, stride_c;
    Elem* d;        // [batch, m, ldd]
    int64_t ldd, stride_d;
    float alpha, beta;
  };
};

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

// Lower-triangle tile t → (row tile i, col tile j), i ≥ j, t = i(i+1)/2 + j.
__device__ __forceinline__ void decode_triangle(int64_t t, int& i, int& j) {
  int r = static_cast<int>((sqrt(8.0 * static_cast<double>(t) + 1.0) - 1.0) * 0.5);
  while (static_cast<int64_t>(r) * (r + 1) / 2 > t) --r;
  while (static_cast<int64_t>(r + 1) * (r + 2) / 2 <= t) ++r;
  i = r;
  j = static_cast<int>(t - static_cast<int64_t>(r) * (r + 1) / 2);
}

// Staged epilogue tile: element (r, c) of the 128×128 tile, 16-byte chunks XOR-swizzled.
// NOTE: the swizzle (chunk ^ r%8 ^ (r/8)%8) makes three access patterns conflict-free:
// the accumulator-layout writes (8 rows × one chunk), the row reads (16 chunks of a row)
// and the mirror's column reads (rows r8·8 + i for 8 consecutive r8).
__device__ __forceinline__ int epilogue_index(int r, int c) {
  return r * 128 + ((((c >> 3) ^ (r & 7) ^ ((r >> 3) & 7)) & 15) << 3) + (c & 7);
}

// Consumers only (256 threads): named barrier 1 (0 is __syncthreads).
__device__ __forceinline__ void consumer_barrier() {
  asm volatile("bar.sync 1, 256;" ::: "memory");
}

template <class Elem, int kStages, bool kStaged>
__global__ void __launch_bounds__(Traits<Elem, kStages, kStaged>::kNumThreads, 1)
    sym_product_kernel(CUTE_GRID_CONSTANT const typename Traits<Elem, kStages, kStaged>::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Traits<Elem, kStages, kStaged>;
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
      EmptyBarrier::init(&smem.empty[s], T::kNumConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), typename T::SmemLayout{});  // (kTile, kTileK, kStages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), typename T::SmemLayout{});  // (kTile, kTileK, kStages)
  Tensor mA = p.tma_a.get_tma_tensor(make_shape(p.m, p.k, p.batch));               // (m, k, batch) coords
  Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.m, p.k, p.batch));               // (m, k, batch) coords
  const int num_k_tiles = (p.k + kTileK - 1) / kTileK;
  const auto tile_mk = make_shape(Int<kTile>{}, Int<kTileK>{});

  if (warpgroup_idx == 0) {
    // Producer: one thread walks the same work list and fills the ring.
    // NOTE: registers move from the producer warpgroup to the consumers (CUTLASS's 40/232
    // split): the consumers hold 64 fp32 accumulators plus the epilogue's state.
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      RingState<kStages> state{0, 1u};  // NOTE: parity 1 — the first round finds every stage free.
      for (int64_t w = blockIdx.x; w < p.num_work; w += gridDim.x) {
        const int l = static_cast<int>(w / p.num_tri);
        int ti, tj;
        decode_triangle(w % p.num_tri, ti, tj);
        Tensor gA = local_tile(mA(_, _, l), tile_mk, make_coord(ti, _));  // (kTile, kTileK, k_tiles)
        Tensor gB = local_tile(mB(_, _, l), tile_mk, make_coord(tj, _));  // (kTile, kTileK, k_tiles)
        auto [tAgA, tAsA] = tma_partition(p.tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA),
                                          group_modes<0, 2>(gA));  // (TMA, k_tiles), (TMA, kStages)
        auto [tBgB, tBsB] = tma_partition(p.tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB),
                                          group_modes<0, 2>(gB));  // (TMA, k_tiles), (TMA, kStages)
        for (int kt = 0; kt < num_k_tiles; ++kt) {
          EmptyBarrier::wait(&smem.empty[state.index], state.phase);
          FullBarrier::arrive_and_expect_tx(&smem.full[state.index], T::kTxBytes);
          copy(p.tma_a.with(smem.full[state.index]), tAgA(_, kt), tAsA(_, state.index));
          copy(p.tma_b.with(smem.full[state.index]), tBgB(_, kt), tBsB(_, state.index));
          state.advance();
        }
      }
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
  Tensor cD = make_identity_tensor(make_shape(Int<kTile>{}, Int<kTile>{}));  // (kTile, kTile) → (r, c)
  Tensor tCcD = thr_mma.partition_C(cD);              // (MMA, MMA_M, MMA_N) coords
  Tensor acc = partition_fragment_C(mma, make_shape(Int<kTile>{}, Int<kTile>{}));  // (MMA, MMA_M, MMA_N) fp32

  RingState<kStages> state{0, 0u};
  for (int64_t w = blockIdx.x; w < p.num_work; w += gridDim.x) {
    const int l = static_cast<int>(w / p.num_tri);
    int ti, tj;
    decode_triangle(w % p.num_tri, ti, tj);

    // Main loop: keep one WGMMA batch in flight; free a stage once its batch retired.
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    int prev_stage = -1;
    for (int kt = 0; kt < num_k_tiles; ++kt) {
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
      if (prev_stage >= 0) EmptyBarrier::arrive(&smem.empty[prev_stage]);
      prev_stage = state.index;
      state.advance();
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    EmptyBarrier::arrive(&smem.empty[prev_stage]);

    const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
    const bool diagonal = ti == tj;
    Elem* d = p.d + l * p.stride_d;
    const Elem* c = p.beta != 0.f ? p.c + l * p.stride_c : nullptr;

    if constexpr (!kStaged) {
      // Direct epilogue: α·acc + β·C in fp32, one rounding, tile and mirror.
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) {
        const int64_t r = row0 + get<0>(tCcD(i)), col = col0 + get<1>(tCcD(i));
        if (r >= p.m || col >= p.m || (diagonal && r < col)) continue;
        float v = p.alpha * acc(i);
        if (c != nullptr) v += p.beta * static_cast<float>(c[r * p.ldc + col]);
        const Elem e = static_cast<Elem>(v);
        d[r * p.ldd + col] = e;
        if (r != col) d[col * p.ldd + r] = e;
      }
    } else {
      // Staged epilogue, pass 1: the rounded tile α·acc + β·C into shared memory.
      Elem* tile = smem.epilogue;  // [kTile, kTile] swizzled
      consumer_barrier();          // NOTE: the previous tile's passes 2–3 are done reading
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) {
        const int tr = get<0>(tCcD(i)), tc = get<1>(tCcD(i));
        const int64_t r = row0 + tr, col = col0 + tc;
        float v = p.alpha * acc(i);
        if (c != nullptr && r < p.m && col < p.m) v += p.beta * static_cast<float>(c[r * p.ldc + col]);
        tile[epilogue_index(tr, tc)] = static_cast<Elem>(v);
      }
      consumer_barrier();

      // Pass 2: rows of the tile, 16 bytes per thread and step (coalesced). On a diagonal
      // tile, (r, c) with r < c takes the value computed for (c, r).
      constexpr int kChunks = kTile * kTile / 8;  // 2048 chunks of 8 elements
      for (int q = consumer_idx; q < kChunks; q += T::kNumConsumerThreads) {
        const int tr = q >> 4, tc = (q & 15) << 3;
        const int64_t r = row0 + tr, col = col0 + tc;
        if (r >= p.m || col >= p.m) continue;
        Elem* out = d + r * p.ldd + col;
        if (!diagonal && col + 8 <= p.m) {
          *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(tile + epilogue_index(tr, tc));
        } else {
          for (int e = 0; e < 8 && col + e < p.m; ++e) {
            const int cc = tc + e;
            out[e] = (diagonal && tr < cc) ? tile[epilogue_index(cc, tr)] : tile[epilogue_index(tr, cc)];
          }
        }
      }
      // Pass 3 (off-diagonal tiles): the mirror, D[col0 + c][row0 + r…r+7] = tile[r…r+7][c].
      if (!diagonal) {
        for (int q = consumer_idx; q < kChunks; q += T::kNumConsumerThreads) {
          const int tc = q >> 4, tr = (q & 15) << 3;
          const int64_t mr = col0 + tc, mc = row0 + tr;  // mirror row / first mirror column
          if (mr >= p.m || mc >= p.m) continue;
          // NOTE: gathered as raw 16-bit values packed into one uint4 (an Elem array
          // indexed through a pointer cast would live in local memory).
          const uint16_t* raw = reinterpret_cast<const uint16_t*>(tile);
          auto pair = [&](int e) {
            return static_cast<uint32_t>(raw[epilogue_index(tr + e, tc)]) |
                   (static_cast<uint32_t>(raw[epilogue_index(tr + e + 1, tc)]) << 16);
          };
          const uint4 packed = make_uint4(pair(0), pair(2), pair(4), pair(6));
          Elem* out = d + mr * p.ldd + mc;
          if (mc + 8 <= p.m) {
            *reinterpret_cast<uint4*>(out) = packed;
          } else {
            const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
            uint16_t* out_raw = reinterpret_cast<uint16_t*>(out);
            CUTE_UNROLL
            for (int e = 0; e < 8; ++e)
              if (mc + e < p.m) out_raw[e] = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
          }
        }
      }
    }
  }
#endif
}

// Host launch of one instance. Requirements are checked by the caller (sym_config_applies).
template <class Elem, int kStages, bool kStaged>
void launch(const SymProductArgs& args, int num_ctas, cudaStream_t stream) {
  using T = Traits<Elem, kStages, kStaged>;
  typename T::Params p{
      T::tma(static_cast<const Elem*>(args.a), static_cast<int>(args.m), static_cast<int>(args.k),
             static_cast<int>(args.batch), args.lda, args.stride_a),
      T::tma(static_cast<const Elem*>(args.b), static_cast<int>(args.m), static_cast<int>(args.k),
             static_cast<int>(args.batch), args.ldb, args.stride_b),
      static_cast<int>(args.m), static_cast<int>(args.k), static_cast<int>(args.batch), 0, 0, 0,
      static_cast<const Elem*>(args.c), args.ldc, args.stride_c, static_cast<Elem*>(args.d), args.ldd,
      args.stride_d, static_cast<float>(args.alpha), static_cast<float>(args.beta)};
  p.num_row_tiles = static_cast<int>((args.m + T::kTile - 1) / T::kTile);
  p.num_tri = static_cast<int64_t>(p.num_row_tiles) * (p.num_row_tiles + 1) / 2;
  p.num_work = p.num_tri * args.batch;

  // Launch: persistent grid of min(work, CTAs) CTAs, one per SM.
  auto kernel = sym_product_kernel<Elem, kStages, kStaged>;
  const int smem_bytes = static_cast<int>(sizeof(typename T::SharedStorage));
  int device = 0, num_sms = 0;
  DMUON_CHECK_CUDA(cudaGetDevice(&device));
  // NOTE: the shared-memory opt-in is a per-device function attribute: set once per device.
  {
    static std::mutex mutex;
    static std::set<int> devices_set;
    std::lock_guard<std::mutex> lock(mutex);
    if (devices_set.insert(device).second)
      DMUON_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  }
  DMUON_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t ctas = num_ctas > 0 ? std::min<int64_t>(num_ctas, num_sms) : num_sms;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.num_work, ctas));
  kernel<<<grid, T::kNumThreads, smem_bytes, stream>>>(p);
  DMUON_CHECK_CUDA(cudaGetLastError());
}

// Every built (stages, staged) instance of one element type; false when not built.
template <class Elem>
bool launch_instance(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  const bool staged = config.epilogue == Sm90Epilogue::kStaged;
  switch (config.stages * 2 + (staged ? 1 : 0)) {
    case 4 * 2: launch<Elem, 4, false>(args, config.num_ctas, stream); return true;
    case 5 * 2: launch<Elem, 5, false>(args, config.num_ctas, stream); return true;
    case 6 * 2: launch<Elem, 6, false>(args, config.num_ctas, stream); return true;
    case 4 * 2 + 1: launch<Elem, 4, true>(args, config.num_ctas, stream); return true;
    case 5 * 2 + 1: launch<Elem, 5, true>(args, config.num_ctas, stream); return true;
    case 6 * 2 + 1: launch<Elem, 6, true>(args, config.num_ctas, stream); return true;
    default: return false;
  }
}

}  // namespace dmuon::ns::cuda::sm90
