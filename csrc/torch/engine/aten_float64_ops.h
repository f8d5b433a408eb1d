// dmuon/torch/engine/aten_float64_ops.h — float64 parameters on any device: a DeviceOps
// that passes everything to the device's own ops except the work of float64 parameters,
// which it does with ATen in float64 (momentum, the iterate, Newton–Schulz through
// aten_orthogonalize (engine/aten_ns.h), the result's rows, the apply).
//
// NOTE: why: the CUDA ops iterate in 16 bits and their fused passes are instantiated for
// float32, bfloat16 and float16 parameters; a float64 parameter asks for float64
// arithmetic. Correctness first: ATen's batched products (cuBLAS dgemm on a GPU), one
// launch per piece for the element-wise passes. The CPU runtime goes through it too, so
// that the CPU tests exercise the path the GPU takes.
//
// Semantics are the CPU ops' (step/cpu/cpu_ops.h): buf ← lerp(buf, g, 1 − μ), U ← lerp(g,
// buf, μ) (Nesterov) or buf; the iterate holds U (the NS normalizes); p ← p·decay + scale·O
// where O is finite, p·decay (and the result flag) where it is not; a closed gate writes
// nothing (the iterate gets zeros). Every pass is enqueued on torch's current stream (the
// ops' stream during a step, OpsStreamScope).
#pragma once

#include <memory>

#include "step/device_ops.h"

namespace dmuon::torch_adapter {

/// `inner` with the float64 work done by ATen (see the file header).
std::unique_ptr<step::DeviceOps> with_aten_float64(std::unique_ptr<step::DeviceOps> inner);

/// The device's own ops under `ops` (`ops` itself when it is not with_aten_float64's).
step::DeviceOps& device_ops_of(step::DeviceOps& ops);

}  // namespace dmuon::torch_adapter
