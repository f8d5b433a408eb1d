// dmuon/ns/cuda/sm90_sym_product.cu — D = α·A·Bᵀ + β·C with a symmetric result, on sm_90a.
//
// Persistent, warp-specialized kernel (CuTe primitives from the CUTLASS headers):
//   warpgroup 0   producer: one thread issues TMA loads of the A and B k-panels of each
//                 work tile into a kStages-deep shared-memory ring (full/empty mbarriers);
//   warpgroups 1–2 consumers: WGMMA 64×128×16 each (the two stacked make a 128×128 tile),
//                 fp32 accumulators, one WGMMA batch kept in flight; then the epilogue.
// Work = (lower-triangle tile (i ≥ j), batch index), enumerated tile-major within each
// matrix so that neighbouring CTAs share A/B panels in L2; each CTA strides over the work
// list (grid = number of SMs). The fp32 epilogue forms α·acc + β·C and writes every
// element of the tile and its mirror D[c][r]; on a diagonal tile only r ≥ c is taken, so
// each output element is written exactly once and D is exactly symmetric.
// NOTE: exact symmetry matters: the antisymmetric part of the rounding error otherwise
// grows through the Gram iteration (see the NOTE in csrc/torch/aten_ns_backend.h).
#include "ns/cuda/sm90_sym_product.h"

// NOTE: cute/tensor.hpp must come first (the atom headers assume its declarations).
#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "ns/cuda/cuda_check.h"

namespace dmuon::ns::cuda {
namespace {

using namespace cute;

// Compile-time shape of the kernel.
// NOTE: 128×128×64 with 5 stages is 160 KiB of ring (32 KiB a stage) and 64 fp32
// accumulators per consumer thread; one CTA per SM. Square tiles keep diagonal tiles
// aligned with the triangle. (Alternatives not measured yet: 128×256 needs rectangular
// triangle tiling.)
template <class Elem>
struct Sm90SymTraits {
  static constexpr int kTile = 128;
  static constexpr int kTileK = 64;
  static constexpr int kStages = 5;
  static constexpr int kNumConsumerThreads = 256;
  static constexpr int kNumThreads = 128 + kNumConsumerThreads;
  static constexpr int kTxBytes = 2 * kTile * kTileK * static_cast<int>(sizeof(Elem));

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

template <class Elem>
__global__ void __launch_bounds__(Sm90SymTraits<Elem>::kNumThreads, 1)
    sm90_sym_product_kernel(CUTE_GRID_CONSTANT const typename Sm90SymTraits<Elem>::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = Sm90SymTraits<Elem>;
  constexpr int kTile = Traits::kTile, kTileK = Traits::kTileK, kStages = Traits::kStages;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;

  extern __shared__ char smem_raw[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const int warpgroup_idx = threadIdx.x / 128;

  // Barrier set-up, visible to the async proxy before any TMA.
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&smem.full[s], 1);
      EmptyBarrier::init(&smem.empty[s], Traits::kNumConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), typename Traits::SmemLayout{});  // (kTile, kTileK, kStages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), typename Traits::SmemLayout{});  // (kTile, kTileK, kStages)
  Tensor mA = p.tma_a.get_tma_tensor(make_shape(p.m, p.k, p.batch));                    // (m, k, batch) coords
  Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.m, p.k, p.batch));                    // (m, k, batch) coords
  const int num_k_tiles = (p.k + kTileK - 1) / kTileK;
  const auto tile_mk = make_shape(Int<kTile>{}, Int<kTileK>{});

  if (warpgroup_idx == 0) {
    // Producer: one thread walks the same work list and fills the ring.
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
          FullBarrier::arrive_and_expect_tx(&smem.full[state.index], Traits::kTxBytes);
          copy(p.tma_a.with(smem.full[state.index]), tAgA(_, kt), tAsA(_, state.index));
          copy(p.tma_b.with(smem.full[state.index]), tBgB(_, kt), tBsB(_, state.index));
          state.advance();
        }
      }
    }
    return;
  }

  // Consumers: WGMMA over the ring, then the mirrored epilogue.
  typename Traits::TiledMma mma;
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

    // Epilogue: α·acc + β·C in fp32, one rounding, tile and mirror.
    const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
    const bool diagonal = ti == tj;
    Elem* d = p.d + l * p.stride_d;
    const Elem* c = p.beta != 0.f ? p.c + l * p.stride_c : nullptr;
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
  }
#endif
}

template <class Elem>
void launch(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  using Traits = Sm90SymTraits<Elem>;
  DMUON_CHECK(config.tile == Traits::kTile && config.tile_k == Traits::kTileK &&
                  config.stages == Traits::kStages,
              "sm90_sym_product: only the 128x128x64, 5-stage configuration is built, got ",
              config.tile, "x", config.tile, "x", config.tile_k, ", ", config.stages, " stages");
  // TMA: 16-byte aligned base and strides (8 elements of 16 bits).
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  DMUON_CHECK(aligned(args.a) && aligned(args.b) && aligned(args.d), "sm90_sym_product: A, B and D must be 16-byte aligned");
  DMUON_CHECK(args.lda % 8 == 0 && args.ldb % 8 == 0 && args.stride_a % 8 == 0 && args.stride_b % 8 == 0,
              "sm90_sym_product: lda/ldb and batch strides must be multiples of 8, got lda=", args.lda,
              " ldb=", args.ldb, " stride_a=", args.stride_a, " stride_b=", args.stride_b);
  DMUON_CHECK(args.m >= 1 && args.k >= 1 && args.batch >= 1 && args.m < (1 << 30) && args.k < (1 << 30),
              "sm90_sym_product: invalid shape [", args.batch, ", ", args.m, ", ", args.k, "]");
  DMUON_CHECK(args.beta == 0.0 || args.c != nullptr, "sm90_sym_product: beta != 0 needs C");

  typename Traits::Params p{
      Traits::tma(static_cast<const Elem*>(args.a), static_cast<int>(args.m), static_cast<int>(args.k),
                  static_cast<int>(args.batch), args.lda, args.stride_a),
      Traits::tma(static_cast<const Elem*>(args.b), static_cast<int>(args.m), static_cast<int>(args.k),
                  static_cast<int>(args.batch), args.ldb, args.stride_b),
      static_cast<int>(args.m), static_cast<int>(args.k), static_cast<int>(args.batch), 0, 0, 0,
      static_cast<const Elem*>(args.c), args.ldc, args.stride_c, static_cast<Elem*>(args.d), args.ldd,
      args.stride_d, static_cast<float>(args.alpha), static_cast<float>(args.beta)};
  p.num_row_tiles = static_cast<int>((args.m + Traits::kTile - 1) / Traits::kTile);
  p.num_tri = static_cast<int64_t>(p.num_row_tiles) * (p.num_row_tiles + 1) / 2;
  p.num_work = p.num_tri * args.batch;

  // Launch: persistent grid of min(work, SMs) CTAs, one per SM.
  auto kernel = sm90_sym_product_kernel<Elem>;
  const int smem_bytes = static_cast<int>(sizeof(typename Traits::SharedStorage));
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
  const int64_t ctas = config.num_ctas > 0 ? config.num_ctas : num_sms;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.num_work, ctas));
  kernel<<<grid, Traits::kNumThreads, smem_bytes, stream>>>(p);
  DMUON_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

void sm90_sym_product(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  if (args.dtype == DType::kFloat16)
    launch<cutlass::half_t>(args, config, stream);
  else
    launch<cutlass::bfloat16_t>(args, config, stream);
}

}  // namespace dmuon::ns::cuda
