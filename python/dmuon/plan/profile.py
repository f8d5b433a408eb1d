"""Measured cost tables for ``python -m dmuon plan --profile``: the step engine's own timing
of Newton–Schulz batches (``_C.plan.measure_ns_costs``, csrc/step/cost_profile.h) on
(rows, cols, num_matrices) points.

The library does not use this module: its engine measures the table it plans with itself
(``Execution.cost_model``). Times are kept in the one measurement store (the autotune
cache's format): ``cache_path``, else the device's default (the autotuner's file on CUDA,
this process's memory on the CPU).
"""

from __future__ import annotations

import os
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


def profile_cost_table(
    points: Iterable[tuple[int, int, int]],
    *,
    device: str | torch.device = "cuda",
    algorithm: str = "gram",
    num_steps: int = 5,
    num_runs: int = 5,
    num_warmup: int = 2,
    cache_path: str | None = None,
):
    """A ``CostTable`` of (rows, cols, num_matrices) float32 NS batches on `device` (its
    current device when CUDA), each the median of `num_runs` timed runs after `num_warmup`,
    read from and kept in the measurement store at `cache_path` (None: the device's default)."""
    from dmuon import _C

    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    schedule = _C.ns_schedule(algorithm, num_steps)
    store = os.path.expanduser(cache_path) if cache_path else ""
    return native().measure_ns_costs(sorted(set(points)), device.type, schedule, num_runs=num_runs,
                                     num_warmup=num_warmup, store_path=store)
