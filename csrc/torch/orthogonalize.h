// dmuon/torch/orthogonalize.h — Newton–Schulz on torch tensors: picks the backend and
// the iteration precision, handles transposition and normalization.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "ns/schedule.h"

namespace dmuon::torch_adapter {

/// Build a validated schedule from op arguments (coefficients flattened as a,b,c,…).
ns::Schedule make_schedule(const std::string& algorithm, at::ArrayRef<double> coefficients,
                           at::IntArrayRef restart_after, double eps);

/// Orthogonalize every matrix of x [..., m, n]; returns fp32 (fp64 for fp64 input) of
/// x's shape. backend: "auto" | "core" (CPU core) | "aten" (batched ATen products) |
/// "cuda" (CUDA backend: sm_90a symmetric kernel where usable, else dense cuBLASLt
/// products mirrored) | "cuda_dense" (CUDA backend, always dense products mirrored);
/// compute_dtype: "auto" | "float64" | "float32" | "float16" | "bfloat16".
/// auto: CPU → core in fp32 (fp64 for fp64 input); CUDA → the CUDA backend in fp16 for
/// Gram NS and bf16 for standard NS (DESIGN.md §3), other compute dtypes on ATen.
/// The CUDA backend is the step engine's ops (step/cuda) on the current stream: what the
/// step runs (they iterate Gram NS in float16 and standard NS in bfloat16).
/// cuda_graphs (CUDA backend): replay the iteration as a CUDA graph; unset: DMUON_CUDA_GRAPHS
/// (default on), read at this call.
at::Tensor orthogonalize(const at::Tensor& x, const ns::Schedule& schedule,
                         const std::string& backend = "auto",
                         const std::string& compute_dtype = "auto",
                         std::optional<bool> cuda_graphs = std::nullopt);

/// [cached problems, captures, replays, bytes of kept workspaces] of the CUDA backend's
/// graph caches, over every stream it ran on (tests; CUDA builds only).
std::vector<int64_t> orthogonalize_graph_stats();

}  // namespace dmuon::torch_adapter
