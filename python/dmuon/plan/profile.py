"""Measured cost tables: time the real Newton–Schulz op per (shape, batch) and cache it.

The median over timed runs and the table itself live in C++ (``_C.plan.profile_cost_table``,
``CostTable.save/load``); this module only launches ``torch.ops.dmuon.orthogonalize`` and
times it (CUDA events on a GPU, ``perf_counter`` on the CPU). On a GPU whose CUDA backend
autotunes, the first call of a point tunes it, and the table takes the autotuner's own
measurement of the winning configuration (the same numbers as its on-disk cache).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable

import torch

from dmuon.plan import native

# NOTE: NS work per matrix is linear in the batch after launch overhead, so sizes
# 1, 2, 4, … up to the largest batch bound the interpolation error by one octave.
_MAX_PROFILED_SIZES = 12


def batch_sizes(count: int) -> list[int]:
    """Batch sizes to time for a shape with `count` matrices: powers of two and count."""
    sizes, b = [], 1
    while b < count and len(sizes) < _MAX_PROFILED_SIZES - 1:
        sizes.append(b)
        b *= 2
    return sorted({*sizes, count})


def cache_key(device: torch.device, algorithm: str, num_steps: int) -> str:
    """What the timings depend on: device, CUDA runtime, torch, dmuon, NS settings."""
    from dmuon import _C

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    # NOTE: the dmuon version is part of the key: a table written by another version (other
    # kernels) is not trusted.
    return (f"{name} | cuda {torch.version.cuda} | torch {torch.__version__} | dmuon {_C.__version__} "
            f"| ns {algorithm} x{num_steps}")


def profile_cost_table(
    points: Iterable[tuple[int, int, int]],
    *,
    device: str | torch.device = "cuda",
    algorithm: str = "gram",
    num_steps: int = 5,
    num_runs: int = 5,
    num_warmup: int = 1,
    cache_path: str | None = None,
):
    """A ``CostTable`` of (rows, cols, num_matrices) points, loaded from `cache_path` when it
    holds timings for this device and settings, else measured (and saved there)."""
    from dmuon import _C

    plan = native()
    device = torch.device(device)
    key = cache_key(device, algorithm, num_steps)
    points = sorted(set(_within_step_batches(points, device, algorithm)))
    if cache_path:
        cached = plan.CostTable()
        try:
            loaded = cached.load(cache_path, key)
        except RuntimeError as error:
            # NOTE: a cache is never trusted: a corrupt or truncated file is ignored with
            # one warning and rebuilt below (written atomically over it).
            warnings.warn(f"ignoring the NS cost cache {cache_path}: {error}", RuntimeWarning, stacklevel=2)
            loaded = False
        if loaded and all(_has(cached, rows, cols, n) for rows, cols, n in points):
            return cached
    steps, restarts = _C.default_schedule(algorithm, num_steps)
    coefficients = [c for step in steps for c in step]
    inputs: dict[tuple[int, int, int], torch.Tensor] = {}

    def run_once(rows: int, cols: int, n: int) -> float:
        x = inputs.get((rows, cols, n))
        if x is None:
            inputs.clear()  # NOTE: keep one input alive at a time (big shapes)
            x = inputs[(rows, cols, n)] = torch.randn(n, rows, cols, device=device)
        op = torch.ops.dmuon.orthogonalize
        if device.type == "cuda" and hasattr(torch.ops.dmuon, "cuda_ns_tuned_ms"):
            # NOTE: the op's first call tunes (and records) this point; later calls reuse it.
            tuned = torch.ops.dmuon.cuda_ns_tuned_ms(x, rows, cols, n, algorithm, coefficients, restarts, 1e-7,
                                                     "float16", _kernel_usable(x))
            if tuned < 0:
                op(x, algorithm, coefficients, restarts, 1e-7)
                tuned = torch.ops.dmuon.cuda_ns_tuned_ms(x, rows, cols, n, algorithm, coefficients, restarts,
                                                         1e-7, "float16", _kernel_usable(x))
            if tuned > 0:
                return tuned * 1e-3
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op(x, algorithm, coefficients, restarts, 1e-7)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        begin = time.perf_counter()
        op(x, algorithm, coefficients, restarts, 1e-7)
        return time.perf_counter() - begin

    table = plan.profile_cost_table(points, run_once, num_runs, num_warmup)
    if cache_path:
        table.save(cache_path, key)
    return table


def _within_step_batches(points: Iterable[tuple[int, int, int]], device: torch.device,
                         algorithm: str) -> list[tuple[int, int, int]]:
    """Each point's batch capped at the largest NS batch a step runs at its shape (the NS
    workspace bound, ``DMUON_NS_BATCH_MB``); the planner extrapolates beyond it.
    NOTE: timing a batch of every matrix of a shape (28 of 3584x18944 for Qwen2.5-7B) made
    rank 0's first step peak at 56.5 GB above the model; a step never forms such a batch."""
    capacity = getattr(torch.ops.dmuon, "cuda_ns_batch_capacity", None) if device.type == "cuda" else None
    if capacity is None:
        return list(points)
    caps: dict[tuple[int, int], int] = {}
    out = []
    for rows, cols, n in points:
        cap = caps.get((rows, cols))
        if cap is None:
            cap = caps[(rows, cols)] = int(capacity(algorithm, rows, cols))
        out.append((rows, cols, min(n, cap)))
    return out


def _kernel_usable(x: torch.Tensor) -> bool:
    """Whether the orthogonalize op's auto backend runs the sm_90a kernel (its tuning key)."""
    ops = torch.ops.dmuon
    return hasattr(ops, "cuda_sym_kernel_usable") and bool(ops.cuda_sym_kernel_usable(x, "float16"))


def _has(table, rows: int, cols: int, n: int) -> bool:
    return any(r == rows and c == cols and b == n for r, c, b, _ in table.entries())
