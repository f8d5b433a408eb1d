"""`bench e2e --fake-world D --profile`: where one training step of each optimizer spends
its time on the fake rank, under torch.profiler.

One extra step per optimizer (after the timed ones, in the same turns) runs under the
profiler with its two phases recorded as host ranges, "bench.fwd_bwd" (forward and
backward, DMuon's hooks inside) and "bench.opt_step" (`optimizer.step()`). For each phase
the summary gives:
- the device timeline (GPUs only): the phase's host range against the union of the device
  activity in it, its idle gaps largest first (bench.timeline);
- the host time inside DMuon's host ranges ("dmuon.*", which the library records: its
  backward-step hooks, and step()'s input checks, engine call and AdamW part) and how often
  the host waited for the device (synchronize calls: each one drains the queue the host
  had run ahead with);
- the CUDA runtime and driver calls made inside those ranges (GPUs), by host time: what
  the library's host time is spent issuing (launches, copies, events, graph replays);
- the phase's top operators by self device time (GPUs) or self host time (CPUs).
NOTE: made to find the cost of the step begun from backward at fake world 64
(docs/benchmarks/history.md, "Sections moved out": +20 ms of forward + backward for 0.7 ms
of Newton–Schulz moved into it): the figures say whether the device idles inside backward
(host waits, syncs) or works more (other streams' work waited on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# Host calls that block until the device has caught up.
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")
# Host ranges the library records (dmuon.backward_step's hooks, DMuon.step's parts).
RANGE_PREFIX = "dmuon."
PHASES = ("bench.fwd_bwd", "bench.opt_step")


@dataclass
class PhaseProfile:
    """One phase of the profiled step."""

    name: str
    host_ms: float
    range_ms: dict[str, float] = field(default_factory=dict)  # library range → host ms (summed)
    range_calls: dict[str, int] = field(default_factory=dict)
    syncs: dict[str, int] = field(default_factory=dict)  # blocking call → count
    runtime: dict[str, list] = field(default_factory=dict)  # CUDA call inside DMuon's ranges → [host ms, count]
    timeline: str = ""  # format_timeline's lines (GPUs), else empty
    top: list[tuple[str, float, int]] = field(default_factory=list)  # (op, self ms, calls)


def _inside(event, span) -> bool:
    return event.time_range.start >= span.time_range.start and event.time_range.end <= span.time_range.end


def summarize(prof, on_gpu: bool, top: int = 8) -> list[PhaseProfile]:
    """The PhaseProfile of each of PHASES in a finished torch.profiler run."""
    from torch.autograd import DeviceType

    from dmuon.cli.bench.timeline import device_timeline, format_timeline

    events = prof.events()
    host = [e for e in events if e.device_type == DeviceType.CPU]
    device = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    phases = []
    for name in PHASES:
        spans = [e for e in host if e.name == name]
        if not spans:
            raise ValueError(f"e2e profile: no host range named {name!r}")
        span = spans[0]
        inner = [e for e in host if e is not span and _inside(e, span)]
        phase = PhaseProfile(name, (span.time_range.end - span.time_range.start) / 1e3)
        for e in inner:
            if e.name.startswith(RANGE_PREFIX):
                phase.range_ms[e.name] = phase.range_ms.get(e.name, 0.0) + (e.time_range.end - e.time_range.start) / 1e3
                phase.range_calls[e.name] = phase.range_calls.get(e.name, 0) + 1
            if e.name in SYNC_CALLS:
                phase.syncs[e.name] = phase.syncs.get(e.name, 0) + 1
        ranges = [e for e in inner if e.name.startswith(RANGE_PREFIX)]
        for e in inner:
            # NOTE: "cu" names the runtime's and the driver's calls (cudaLaunchKernel, cuLaunchKernel).
            if e.name.startswith("cu") and any(_inside(e, r) for r in ranges):
                entry = phase.runtime.setdefault(e.name, [0.0, 0])
                entry[0] += (e.time_range.end - e.time_range.start) / 1e3
                entry[1] += 1
        totals: dict[str, list[float]] = {}
        if on_gpu:
            window = (span.time_range.start, span.time_range.end)
            activity = [(e.time_range.start, e.time_range.end, e.name) for e in device
                        if e.time_range.end > window[0] and e.time_range.start < window[1]]
            phase.timeline = format_timeline(device_timeline(window, activity, min_gap_us=20.0))
            for s, t, n in activity:
                totals.setdefault(n, [0.0, 0])
                totals[n][0] += (t - s) / 1e3
                totals[n][1] += 1
        else:
            # NOTE: self host time: an op's time less that of the ops it called.
            for e in inner:
                if e.name.startswith(RANGE_PREFIX):
                    continue
                children = sum(c.time_range.end - c.time_range.start for c in e.cpu_children)
                totals.setdefault(e.name, [0.0, 0])
                totals[e.name][0] += (e.time_range.end - e.time_range.start - children) / 1e3
                totals[e.name][1] += 1
        phase.top = sorted(((n, v[0], int(v[1])) for n, v in totals.items()), key=lambda x: -x[1])[:top]
        phases.append(phase)
    return phases


def format_phases(optimizer: str, phases: list[PhaseProfile], on_gpu: bool, width: int = 60) -> str:
    """The printed summary of one optimizer's profiled step."""
    short = lambda name: name if len(name) <= width else name[: width - 1] + "…"  # noqa: E731
    lines = [f"profile of one {optimizer} step ({'device time' if on_gpu else 'self host time'} per operator):"]
    for p in phases:
        ranges = ", ".join(f"{n[len(RANGE_PREFIX):]} {p.range_ms[n]:.2f} ms in {p.range_calls[n]} calls"
                           for n in sorted(p.range_ms)) or "none"
        syncs = ", ".join(f"{n} x{c}" for n, c in sorted(p.syncs.items())) or "none"
        lines.append(f" {p.name}: host range {p.host_ms:.2f} ms; DMuon's ranges: {ranges}; host waits: {syncs}")
        if p.runtime:
            calls = sorted(p.runtime.items(), key=lambda kv: -kv[1][0])[:6]
            lines.append("  CUDA calls inside DMuon's ranges: " +
                         ", ".join(f"{n} x{c} {ms:.2f} ms" for n, (ms, c) in calls))
        if p.timeline:
            lines.append(p.timeline)
        for name, ms, calls in p.top:
            lines.append(f"    {ms:9.3f} ms  {calls:6d}x  {short(name)}")
    return "\n".join(lines)


def profiled_step(step: Callable[[Callable[[str], object]], None], on_gpu: bool):
    """Runs step(phase) once under torch.profiler, where phase(name) is the context of a
    host range; returns the finished profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    if on_gpu:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        step(record_function)
        if on_gpu:
            torch.cuda.synchronize()
    return prof
