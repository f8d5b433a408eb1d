// dmuon/ns/cuda/alignment.h — the alignment tests of the vectorized kernels and TMA.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmuon::ns::cuda {

/// Whether `p` may be read and written as vectors of `bytes` bytes.
inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
/// Whether `p` may be read and written as 16-byte vectors (uint4, float4) or by TMA.
inline bool aligned16(const void* p) { return aligned_to(p, 16); }

}  // namespace dmuon::ns::cuda
