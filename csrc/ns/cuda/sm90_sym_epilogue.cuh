// dmuon/ns/cuda/sm90_sym_epilogue.cuh — the sm_90a symmetric kernel's epilogues: how a
// unit's fp32 accumulators become α·acc + β·C, rounded once to 16 bits, written to D at the
// tile and at its mirror (so that D is exactly symmetric): direct (per-element stores from
// the accumulators), staged (through a swizzled shared-memory tile, 16-byte coalesced rows
// and mirrored rows) or tmastore (8×8 blocks into shared-memory tile and mirror, stored by
// TMA while the next unit's mainloop runs); with the tail split-K a tile's k-slices are
// summed first (split_k_reduce). Details: docs/design/sm90_sym_kernel.md, "Epilogues".
#pragma once

#include <cstdint>

#include "ns/cuda/sm90_sym_mainloop.cuh"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

// Staged epilogue tile: element (r, c) of the 128×128 tile, 16-byte chunks XOR-swizzled.
// NOTE: the swizzle (chunk ^ r%8 ^ (r/8)%8) makes three access patterns conflict-free:
// the accumulator-layout writes (8 rows × one chunk), the row reads (16 chunks of a row)
// and the mirror's column reads (rows r8·8 + i for 8 consecutive r8).
__device__ __forceinline__ int epilogue_index(int r, int c) {
  return r * 128 + ((((c >> 3) ^ (r & 7) ^ ((r >> 3) & 7)) & 15) << 3) + (c & 7);
}

// tmastore epilogue tile: element (r, c) of Traits::EpiLayout (128×128, 8×64 atoms with the
// 128-byte swizzle: 16-byte chunk (c/8)%8 of row r XOR r%8; column halves 8192 apart).
// NOTE: computed here rather than through the CuTe tensor: indexing that tensor for the 64
// accumulator values kept 128 smem offsets live across the tile loop (168 registers,
// 640 bytes of spills per thread in ptxas -v, nvcc 13).
__host__ __device__ __forceinline__ int tma_tile_index(int r, int c) {
  return ((c >> 6) << 13) + (r << 6) + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
}

// tmastore epilogue in 8×8 matrices of 16-bit values (ldmatrix / stmatrix).
// A consumer warp's accumulators hold 16 rows of the tile (rows 16·warp …, checked on the
// host: fragment_is_mma_layout) as 8×8 blocks in the mma fragment layout: lane ℓ holds row
// ℓ/4, columns 2·(ℓ%4) and 2·(ℓ%4) + 1 of each block. ldmatrix reads C's blocks into that
// layout, stmatrix writes the rounded blocks to the tile, and stmatrix .trans writes them
// transposed to the mirror. In an x4 instruction lane ℓ gives the address of row ℓ%8 of
// block ℓ/8 and register q carries block q. Every row address is a 16-byte chunk of the
// swizzled tile (tma_tile_index of a column multiple of 8).
// NOTE: why: the per-element epilogue issued 192 shared-memory accesses and 128 index
// computations per thread and tile; in 8×8 blocks it is 24 instructions. Measured on an
// H200 (lab/kernels/sym_kernel_bench.py): β·C products 896³ b72 14–17% and 1536³ b56 6–15%
// faster on every tmastore configuration, long-k X·Xᵀ within ±3%.
__device__ __forceinline__ void load_blocks_x4(const void* row, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(cute::cast_smem_ptr_to_uint(row))
               : "memory");
}
__device__ __forceinline__ void store_blocks_x4(void* row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   cute::cast_smem_ptr_to_uint(row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void store_blocks_x4_transposed(void* row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   cute::cast_smem_ptr_to_uint(row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// A 16-byte chunk of 16-bit values at columns c0 … c0 + 7 of row r of a diagonal tile: the
// values above the diagonal (column > r) are taken from the chunk at `from`, the others kept.
__device__ __forceinline__ void take_above_diagonal(uint4* to, const uint4* from, int r, int c0) {
  const uint4 source = *from;
  if (c0 > r) {
    *to = source;
    return;
  }
  uint4 merged = *to;
  uint32_t* m32 = reinterpret_cast<uint32_t*>(&merged);
  const uint32_t* f32 = reinterpret_cast<const uint32_t*>(&source);
  CUTE_UNROLL
  for (int e = 0; e < 8; ++e) {
    if (c0 + e <= r) continue;
    const uint32_t mask = 0xffffu << (16 * (e % 2));
    m32[e / 2] = (m32[e / 2] & ~mask) | (f32[e / 2] & mask);
  }
  *to = merged;
}

// Two fp32 values rounded to Elem (as static_cast does), packed low first; and back.
template <class Elem>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  return static_cast<uint32_t>(static_cast<Elem>(lo).raw()) | (static_cast<uint32_t>(static_cast<Elem>(hi).raw()) << 16);
}
template <class Elem>
__device__ __forceinline__ float low_of(uint32_t v) {
  return static_cast<float>(Elem::bitcast(static_cast<uint16_t>(v & 0xffffu)));
}
template <class Elem>
__device__ __forceinline__ float high_of(uint32_t v) {
  return static_cast<float>(Elem::bitcast(static_cast<uint16_t>(v >> 16)));
}

// `v`, which the compiler must treat as unknown here: what is computed from it stays in
// the loop iteration that computes it.
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

// Split-K, consumers (256 threads): store this slice's accumulators, count the slice in its
// tile's counter; true (with `acc` the sum of every slice, in slice order) for the slice
// that counted last, false for the others.
// NOTE: the threadfence-reduction pattern: each thread's stores are fenced before the
// barrier that precedes the counting atomic; the last slice fences again before it reads
// (L2-coherent loads: the other slices' stores never sat in this SM's L1).
template <class T, class Acc>
__device__ __forceinline__ bool split_k_reduce(const typename T::Params& p, const WorkUnit& u, int consumer_idx,
                                               Acc& acc, int* split_last) {
  constexpr int kValues = decltype(size(acc))::value;  // 64 (128×128 units) or 128 (128×256)
  static_assert(kValues == T::kColTiles * T::kTileValues, "fp32 accumulators of one unit per consumer thread");
  constexpr int kVecs = kValues / 4, kThreads = T::kNumConsumerThreads;
  float4* tile_slices = reinterpret_cast<float4*>(p.partials) + static_cast<int64_t>(u.slot) * p.split * kVecs * kThreads;
  float4* mine = tile_slices + static_cast<int64_t>(u.part) * kVecs * kThreads + consumer_idx;
  CUTE_UNROLL
  for (int q = 0; q < kVecs; ++q)
    __stcg(mine + q * kThreads, make_float4(acc(4 * q), acc(4 * q + 1), acc(4 * q + 2), acc(4 * q + 3)));
  __threadfence();
  consumer_barrier();
  if (consumer_idx == 0) *split_last = atomicAdd(&p.counters[u.slot], 1) == p.split - 1;
  consumer_barrier();
  if (!*split_last) return false;
  __threadfence();
  CUTE_UNROLL
  for (int q = 0; q < kVecs; ++q) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int part = 0; part < p.split; ++part) {
      const float4 v = part == u.part ? make_float4(acc(4 * q), acc(4 * q + 1), acc(4 * q + 2), acc(4 * q + 3))
                                      : __ldcg(tile_slices + (static_cast<int64_t>(part) * kVecs + q) * kThreads +
                                               consumer_idx);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    acc(4 * q) = sum.x, acc(4 * q + 1) = sum.y, acc(4 * q + 2) = sum.z, acc(4 * q + 3) = sum.w;
  }
  return true;
}

// Wide tmastore buffers: element (r, c) of the 128×64 subtile (= of the C half-tile in a ring
// stage: the A panel's layout), and of its 64×128 mirror (two 64×64 halves, 4096 apart). Both
// are 64×64 boxes of 8×64 atoms with the 128-byte swizzle (Traits::SubLayout).
__host__ __device__ __forceinline__ int subtile_index(int r, int c) {
  return (r << 6) + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
}
__host__ __device__ __forceinline__ int sub_mirror_index(int r, int c) { return ((c >> 6) << 12) + subtile_index(r, c); }

// Wide tmastore, consumers (256 threads): the epilogue of a 128×256 unit (nothing is written
// unless `writes`). Per column tile h
// (the C stage use first, when β ≠ 0, taken and released whether or not this CTA writes) and
// per 64-column subtile: α·acc + β·C rounded once into the subtile buffer and transposed into
// the mirror, in 8×8 blocks as the 128×128 tmastore epilogue; then one thread issues TMA
// stores of its 64×64 boxes. The buffers are reused once the previous stores have read them.
// A diagonal tile (h = the unit's diagonal) stores: subtile 0's rows 0–63 (its diagonal
// quadrant, upper part merged from the mirror) and 64–127, and its mirror's columns 64–127
// (the quadrant above the diagonal, from values below it); subtile 1's rows 64–127 (merged).
// A column tile above the diagonal (h = 1 of an even row's last unit) is not written.
// NOTE: why subtiles: four 48 KiB stages and one 32 KiB buffer pair fit in 227 KiB; 128×128
// tile and mirror (64 KiB) would leave 3 stages.
template <class T, class Acc, class Storage>
__device__ __forceinline__ void wide_tmastore_epilogue(const typename T::Params& p, const WorkUnit& u, bool with_c,
                                                       bool writes, int consumer_idx, const Acc& acc, Storage& smem,
                                                       RingState<T::kStages>& state, bool& store_pending,
                                                       int& epi_seq) {
  using Elem = typename T::Element;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  const int warp = consumer_idx / 32, lane = consumer_idx % 32;
  const int quad = lane / 8, sub = lane % 8;  // the block this lane addresses, and its row
  const int row = 16 * warp + 8 * (quad % 2) + sub;
  Tensor mD = p.tma_d.get_tma_tensor(make_shape(p.m, p.m, p.batch));  // (m, m, batch) coords
  // One 64×64 box of D from shared memory `from` (SubLayout), clipped at m × m.
  auto store_box = [&](Elem* from, int box_row, int box_col) {
    Tensor sX = make_tensor(make_smem_ptr(from), typename T::SubLayout{});
    Tensor gX = local_tile(mD(_, _, u.l), make_shape(Int<64>{}, Int<64>{}), make_coord(box_row, box_col));
    auto [tXgX, tXsX] = tma_partition(p.tma_d, group_modes<0, 2>(sX), group_modes<0, 2>(gX));
    copy(p.tma_d, tXsX, tXgX);
  };
  cute::for_each(make_int_sequence<T::kColTiles>{}, [&](auto h_) {
    constexpr int h = decltype(h_)::value;
    const int tj = T::kColTiles * u.tj + h;
    int slot = 0;
    if (with_c) {
      FullBarrier::wait(&smem.full[state.index], state.phase);
      slot = state.index;
    }
    if (writes && tj <= u.ti) {
      const bool diagonal = tj == u.ti;
      cute::for_each(make_int_sequence<2>{}, [&](auto s_) {
        constexpr int s = decltype(s_)::value;
        // This subtile's buffer pair (kEpiBuffers of them in turn), once the stores that last
        // read it are done (with two pairs the latest stores, from the other pair, may still run).
        const int buffer = T::kEpiBuffers > 1 ? epi_seq++ % T::kEpiBuffers : 0;
        Elem* tile = smem.tile + buffer * T::kTmaTileElems;      // [128, 64] at subtile_index
        Elem* mirror = smem.mirror + buffer * T::kTmaTileElems;  // [64, 128] at sub_mirror_index
        if (consumer_idx == 0 && store_pending) {
          tma_store_wait<T::kEpiBuffers - 1>();
          if constexpr (T::kEpiBuffers == 1) store_pending = false;
        }
        consumer_barrier();
        const Elem* c_half = c_half_in_stage<T>(smem, slot, s);  // [128, 64] at subtile_index
        CUTE_UNROLL
        for (int jj = 0; jj < 4; ++jj) {
          const int col = 8 * (2 * jj + quad / 2);  // this lane's block: subtile column
          uint32_t c_pairs[4] = {0u, 0u, 0u, 0u}, out[4];
          if (with_c) load_blocks_x4(c_half + subtile_index(row, col), c_pairs);
          CUTE_UNROLL
          for (int q = 0; q < 4; ++q) {
            // NOTE: accumulator 64h + 8·(4s + jj) + 2q: column tile h, columns 64s + 16jj + 8(q/2) …
            float lo = p.alpha * acc(64 * h + 8 * (4 * s + jj) + 2 * q);
            float hi = p.alpha * acc(64 * h + 8 * (4 * s + jj) + 2 * q + 1);
            if (with_c) {
              lo += p.beta * low_of<Elem>(c_pairs[q]);
              hi += p.beta * high_of<Elem>(c_pairs[q]);
            }
            out[q] = pack_pair<Elem>(lo, hi);
          }
          store_blocks_x4(tile + subtile_index(row, col), out);
          store_blocks_x4_transposed(mirror + sub_mirror_index(col + sub, 16 * warp + 8 * (quad % 2)), out);
        }
        // Diagonal quadrant s (subtile rows 64s …): above its diagonal, (64s + a, c) takes the
        // value computed for (64s + c, 64s + a), which is mirror (a, 64s + c). 16-byte chunks.
        if (diagonal) {
          consumer_barrier();  // NOTE: every warp's mirror blocks are written
          for (int q = consumer_idx; q < 64 * 8; q += T::kNumConsumerThreads) {
            const int a = q / 8, c0 = 8 * (q % 8);
            if (c0 + 7 <= a) continue;  // no element above the diagonal
            take_above_diagonal(reinterpret_cast<uint4*>(tile + subtile_index(64 * s + a, c0)),
                                reinterpret_cast<const uint4*>(mirror + sub_mirror_index(a, 64 * s + c0)), a, c0);
          }
        }
        tma_store_fence();  // the generic-proxy writes, visible to the TMA unit
        consumer_barrier();
        if (consumer_idx == 0) {
          const int box_row = 2 * u.ti, box_col = 2 * tj + s;  // the tile's row boxes, this subtile's column box
          if (!diagonal || s == 0) store_box(tile, box_row, box_col);
          store_box(tile + 4096, box_row + 1, box_col);
          if (!diagonal) store_box(mirror, box_col, box_row);
          if (!diagonal || s == 0) store_box(mirror + 4096, box_col, box_row + 1);
          tma_store_arrive();
          store_pending = true;
        }
        __syncwarp();
      });
    }
    if (with_c) {
      release_stage<T>(smem.empty, slot);
      state.advance();
    }
  });
}

// The unit's output tiles: column tile tj = u.tj·kColTiles + h of row tile u.ti, from
// accumulators [kTileValues·h, kTileValues·(h + 1)); body(h, tj) for each one written. n256:
// a unit's second tile above the diagonal (column tile ti + 1) is skipped; its values are
// the mirror of another tile's.
// NOTE: compile-time loops over h, so that every accumulator index stays a constant
// (registers, not local memory).
template <class T, class Body>
__device__ __forceinline__ void for_each_written_tile(const WorkUnit& u, Body&& body) {
  cute::for_each(make_int_sequence<T::kColTiles>{}, [&](auto h) {
    const int tj = u.tj * T::kColTiles + decltype(h)::value;
    if (T::kColTiles == 1 || tj <= u.ti) body(h, tj);
  });
}

// tmastore epilogue (128×128 units; consumers, 256 threads): the tile and its mirror through
// the shared-memory tiles that the producer loaded C into, then TMA stores by one thread.
template <class T, class Acc, class Storage>
__device__ __forceinline__ void tmastore_epilogue(const typename T::Params& p, const WorkUnit& u, bool with_c,
                                                  int consumer_idx, const Acc& acc, Storage& smem, uint32_t& c_phase,
                                                  bool& store_pending) {
  using Elem = typename T::Element;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kTile = T::kTile;
  const int l = u.l, ti = u.ti;
  const auto tile_mm = make_shape(Int<kTile>{}, Int<kTile>{});
  const int tj = u.tj;
  const bool diagonal = ti == tj;
  // tmastore epilogue, pass 1: α·acc + β·C in fp32 (C from the tile the producer
  // loaded), rounded once, into the tile and its transpose into the mirror. A diagonal
  // tile takes its lower triangle's values in both halves and has no mirror.
  Tensor sT = make_tensor(make_smem_ptr(smem.tile), typename T::EpiLayout{});    // (kTile, kTile)
  Tensor sM = make_tensor(make_smem_ptr(smem.mirror), typename T::EpiLayout{});  // (kTile, kTile)
  Elem* tile = smem.tile;      // [kTile, kTile] at tma_tile_index (= sT's layout)
  Elem* mirror = smem.mirror;  // [kTile, kTile] at tma_tile_index (= sM's layout)
  if (with_c) {
    FullBarrier::wait(&smem.c_full, c_phase);
    c_phase ^= 1u;
  }
  consumer_barrier();  // NOTE: without C, orders these writes after the release above
  // In 8×8 blocks (see load_blocks_x4), four an instruction: warp w holds rows 16w …
  // 16w + 15, and accumulator pair 8·jj + 2·q (q = 0…3) is the block at rows
  // 16w + 8·(q%2) …, columns 8·(2·jj + q/2) …. Each block goes to the tile in place
  // of C and transposed to the mirror; a warp reads and writes only its own rows of the
  // tile.
  const int warp = consumer_idx / 32, lane = consumer_idx % 32;
  const int quad = lane / 8, sub = lane % 8;  // the block this lane addresses, and its row
  const int row = 16 * warp + 8 * (quad % 2) + sub;
  CUTE_UNROLL
  for (int jj = 0; jj < 8; ++jj) {
    const int col = 8 * (2 * jj + quad / 2);
    Elem* at = tile + tma_tile_index(row, col);
    uint32_t c_pairs[4] = {0u, 0u, 0u, 0u}, out[4];
    if (with_c) load_blocks_x4(at, c_pairs);
    CUTE_UNROLL
    for (int q = 0; q < 4; ++q) {
      float lo = p.alpha * acc(8 * jj + 2 * q), hi = p.alpha * acc(8 * jj + 2 * q + 1);
      if (with_c) {
        lo += p.beta * low_of<Elem>(c_pairs[q]);
        hi += p.beta * high_of<Elem>(c_pairs[q]);
      }
      out[q] = pack_pair<Elem>(lo, hi);
    }
    store_blocks_x4(at, out);
    store_blocks_x4_transposed(mirror + tma_tile_index(col + sub, 16 * warp + 8 * (quad % 2)), out);
  }
  // A diagonal tile takes its lower triangle's values in both halves: above the
  // diagonal, (r, c) becomes mirror (r, c), the value computed for (c, r). The mirror is
  // not stored. 16-byte chunks; a chunk the diagonal cuts is merged element by element.
  // NOTE: per element, the lower values would need 32 single-block instructions with
  // branches: ptxas then spilled 1.4 KiB (nvcc 13).
  if (diagonal) {
    consumer_barrier();  // NOTE: every warp's mirror blocks are written
    constexpr int kChunks = kTile * kTile / 8;
    for (int q = consumer_idx; q < kChunks; q += T::kNumConsumerThreads) {
      const int r = q / (kTile / 8), c0 = 8 * (q % (kTile / 8));
      if (c0 + 7 <= r) continue;  // no element above the diagonal
      take_above_diagonal(reinterpret_cast<uint4*>(tile + tma_tile_index(r, c0)),
                          reinterpret_cast<const uint4*>(mirror + tma_tile_index(r, c0)), r, c0);
    }
  }
  tma_store_fence();  // the generic-proxy writes, visible to the TMA unit
  consumer_barrier();

  // Pass 2: one thread stores the tile and the mirror (clipped at m × m) and moves on.
  if (consumer_idx == 0) {
    Tensor mD = p.tma_d.get_tma_tensor(make_shape(p.m, p.m, p.batch));  // (m, m, batch) coords
    Tensor gD = local_tile(mD(_, _, l), tile_mm, make_coord(ti, tj));    // (kTile, kTile)
    auto [tDgD, tDsT] = tma_partition(p.tma_d, group_modes<0, 2>(sT), group_modes<0, 2>(gD));
    copy(p.tma_d, tDsT, tDgD);
    if (!diagonal) {
      Tensor gM = local_tile(mD(_, _, l), tile_mm, make_coord(tj, ti));  // (kTile, kTile)
      auto [tMgM, tMsM] = tma_partition(p.tma_d, group_modes<0, 2>(sM), group_modes<0, 2>(gM));
      copy(p.tma_d, tMsM, tMgM);
    }
    tma_store_arrive();
    store_pending = true;
  }
  __syncwarp();
}

// Direct epilogue (consumers): each thread's accumulators straight to D, at (r, c) and (c, r).
// tEcD: the accumulators' (row, column) coordinates in the unit.
template <class T, class Acc, class Coords>
__device__ __forceinline__ void direct_epilogue(const typename T::Params& p, const WorkUnit& u, const Acc& acc,
                                                const Coords& tEcD) {
  using Elem = typename T::Element;
  constexpr int kTile = T::kTile;
  const int l = u.l, ti = u.ti;
  Elem* d = p.d + l * p.stride_d;
  const Elem* c = p.beta != 0.f ? p.c + l * p.stride_c : nullptr;
  // Direct epilogue: α·acc + β·C in fp32, one rounding, tile and mirror.
  for_each_written_tile<T>(u, [&](auto h, int tj) {
    constexpr int kOff = decltype(h)::value * T::kTileValues, kColOff = decltype(h)::value * kTile;
    const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
    const bool diagonal = ti == tj;
    CUTE_UNROLL
    for (int i = 0; i < T::kTileValues; ++i) {
      const int64_t r = row0 + get<0>(tEcD(kOff + i)), col = col0 + get<1>(tEcD(kOff + i)) - kColOff;
      if (r >= p.m || col >= p.m || (diagonal && r < col)) continue;
      float v = p.alpha * acc(kOff + i);
      if (c != nullptr) v += p.beta * static_cast<float>(c[r * p.ldc + col]);
      const Elem e = static_cast<Elem>(v);
      d[r * p.ldd + col] = e;
      if (r != col) d[col * p.ldd + r] = e;
    }
  });
}

// Staged epilogue (consumers, 256 threads): the unit's tiles through a swizzled shared-memory
// tile, then coalesced 16-byte stores of its rows and of its mirror.
template <class T, class Acc, class Coords, class Storage>
__device__ __forceinline__ void staged_epilogue(const typename T::Params& p, const WorkUnit& u, int consumer_idx,
                                                const Acc& acc, const Coords& tEcD, Storage& smem) {
  using Elem = typename T::Element;
  constexpr int kTile = T::kTile;
  const int l = u.l, ti = u.ti;
  Elem* d = p.d + l * p.stride_d;
  const Elem* c = p.beta != 0.f ? p.c + l * p.stride_c : nullptr;
  // Staged epilogue, pass 1: every tile of the unit, rounded α·acc + β·C, into shared
  // memory (n256: both at once, so that no accumulator stays live through passes 2–3).
  consumer_barrier();  // NOTE: the previous unit's passes 2–3 are done reading
  for_each_written_tile<T>(u, [&](auto h, int tj) {
    constexpr int kOff = decltype(h)::value * T::kTileValues, kColOff = decltype(h)::value * kTile;
    Elem* tile = smem.epilogue + decltype(h)::value * kTile * kTile;  // [kTile, kTile] swizzled
    const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
    CUTE_UNROLL
    for (int i = 0; i < T::kTileValues; ++i) {
      const int tr = get<0>(tEcD(kOff + i)), tc = get<1>(tEcD(kOff + i)) - kColOff;
      const int64_t r = row0 + tr, col = col0 + tc;
      float v = p.alpha * acc(kOff + i);
      if (c != nullptr && r < p.m && col < p.m) v += p.beta * static_cast<float>(c[r * p.ldc + col]);
      tile[epilogue_index(tr, tc)] = static_cast<Elem>(v);
    }
  });
  consumer_barrier();

  for_each_written_tile<T>(u, [&](auto h, int tj) {
    const Elem* tile = smem.epilogue + decltype(h)::value * kTile * kTile;  // [kTile, kTile] swizzled
    const int64_t row0 = static_cast<int64_t>(ti) * kTile, col0 = static_cast<int64_t>(tj) * kTile;
    const bool diagonal = ti == tj;
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
  });
}

}  // namespace dmuon::ns::cuda::sm90
