"""Timing for the benchmarks: CUDA-event timing of one function's median, and several
functions timed in turns (every function once a round), the way `bench ns` compares
methods; and the wall time of optimizer steps with their peak memory (`bench step`)."""

from __future__ import annotations

import statistics
import time
from typing import NamedTuple

import torch

from dmuon.cli.bench.memory import memory_in_use, peak, reset_peak, sync


# Spin-kernel length that keeps the device busy while the host enqueues a whole step
# (about 25 ms at H200 clocks).
_HOST_AHEAD_CYCLES = 50_000_000


def cuda_time_ms(fn, warmup: int, iters: int, host_ahead: bool = False) -> float:
    """Median of `iters` CUDA-event timings of fn() after `warmup` calls.

    host_ahead: a spin kernel runs before each start event, so the host has enqueued fn's
    work by the time the device reaches it: the time then excludes the host's launch lead
    (device time only, up to fn's own waits for the device)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if host_ahead:
            torch.cuda._sleep(_HOST_AHEAD_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_time_ms(fn, warmup: int, iters: int) -> float:
    """Median wall-clock milliseconds of `iters` calls of fn() after `warmup` (cuda_time_ms
    where no GPU is: the host's work is all there is)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def interleaved_ms(fns: dict, iters, rounds: int = 5, rotate: bool = True, timer=None) -> dict:
    """Median time (`timer`: cuda_time_ms by default, or wall_time_ms) of every function of `fns` (name →
    callable) over `rounds` rounds; in each round every function is timed once (one warm-up,
    then `iters` timings: an int, or name → int), in turns. With `rotate`, round r starts at
    the r-th function, so that no function always follows the same one.
    NOTE: why: under the H200's power limit the clock follows the recent load (Nsight Compute
    read 1.30–1.50 GHz across GEMM kernels), so methods timed one after the other can see
    different clocks (the same kernel timed twice in a row of configurations came out 8%
    apart: 3584×18944 X·Xᵀ b15); in turns they all see the same mix."""
    timer = timer or cuda_time_ms
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)] if rotate else names[i]
            count = iters[name] if isinstance(iters, dict) else iters
            times[name].append(timer(fns[name], 1, count))
    return {name: statistics.median(values) for name, values in times.items()}


def alternating_ms(fn_a, fn_b, iters: int, rounds: int = 5) -> tuple[float, float]:
    """Medians of fn_a's and fn_b's CUDA-event times over `rounds` alternating rounds of
    `iters` timings each (interleaved_ms, a before b in every round)."""
    out = interleaved_ms({"a": fn_a, "b": fn_b}, iters, rounds, rotate=False)
    return out["a"], out["b"]


class StepTimes(NamedTuple):
    times: list  # wall seconds of each timed step
    first_peak_extra: int  # peak bytes above the start over every step, the warm-up's included
    peak_extra: int  # peak bytes above the start over the timed steps


def wall_steps(step, num_steps: int, warmup: int, device: str, *, barrier: bool = False,
               before: int | None = None, after_timed=None) -> StepTimes:
    """Wall time of each of `num_steps` calls of step() after `warmup` untimed ones, and the
    peak memory above `before` (default: what is in use now). On CUDA each step is
    synchronized, so a time covers the device work too; `barrier`: the ranks of the default
    group start each step together; `after_timed()` runs after each timed step, untimed.
    NOTE: the warm-up steps build the runtime (plan, cost table, tuning, graphs): their peak
    is reported apart from the steady step's."""
    before = memory_in_use(device) if before is None else before
    reset_peak(device)
    times, first_peak = [], 0
    for i in range(warmup + num_steps):
        if barrier:
            import torch.distributed as dist

            dist.barrier()
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            if after_timed is not None:
                after_timed()
        elif i == warmup - 1:
            first_peak = max(0, peak(device) - before)
            reset_peak(device)
    steady = max(0, peak(device) - before)
    return StepTimes(times, max(first_peak, steady), steady)
