// dmuon/ns/cuda/alignment.h — the 16-byte alignment test of the vectorized kernels and TMA.
#pragma once

#include <cstdint>

namespace dmuon::ns::cuda {

/// Whether `p` may be read and written as 16-byte vectors (uint4, float4) or by TMA.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace dmuon::ns::cuda
