// dmuon/ns/cpu/cpu_backend.h — Newton–Schulz on the CPU, in fp32 or fp64.
#pragma once

#include <cstdint>
#include <functional>

#include "ns/schedule.h"

namespace dmuon::ns {

/// Runs body(begin, end) over [0, n), possibly in parallel chunks.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t, int64_t)>&)>;

/// Serial ParallelFor (the default).
void serial_for(int64_t n, const std::function<void(int64_t, int64_t)>& body);

/// Orthogonalize `batch` packed row-major rows×cols matrices in place with `schedule`.
/// Iterates in T (the CPU has no fast half precision); tall matrices are iterated
/// transposed. Each matrix is normalized by max(‖X‖_F, eps) first. Throws dmuon::Error
/// naming the batch index when a matrix holds a non-finite value (nothing is written).
template <typename T>
void orthogonalize_cpu(const Schedule& schedule, T* data, int64_t batch, int64_t rows,
                       int64_t cols, const ParallelFor& parallel_for = serial_for);

}  // namespace dmuon::ns
