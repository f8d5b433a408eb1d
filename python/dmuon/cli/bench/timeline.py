"""Where a profiled step leaves the GPU idle: the device timeline of one torch.profiler run,
reduced to busy time, idle gaps and the host time around the device work.

Used by `bench ns --profile`. Pure Python over the profiler's events, so it is tested on CPU
with synthetic intervals (tests/python/test_bench_timeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Gap:
    start_us: float
    length_us: float
    before: str  # the device activity that ended at the gap's start
    after: str   # the device activity that starts at its end


@dataclass
class Timeline:
    wall_us: float         # the step's host range (first to last host event of the step)
    busy_us: float         # union of device activity within it
    lead_us: float         # host range start → first device activity
    tail_us: float         # last device activity end → host range end
    gaps: list[Gap] = field(default_factory=list)  # idle gaps between device activities, largest first

    @property
    def idle_between_us(self) -> float:
        return sum(g.length_us for g in self.gaps)


def device_timeline(host_range: tuple[float, float], activities: list[tuple[float, float, str]],
                    min_gap_us: float = 0.0) -> Timeline:
    """Busy time and idle gaps of `activities` ((start, end, name) in µs, any order, possibly
    overlapping: several streams) inside `host_range` (start, end) in µs.
    Gaps shorter than `min_gap_us` still count in busy/idle totals but are not listed."""
    begin, end = host_range
    if end < begin:
        raise ValueError(f"host_range: end {end} before start {begin}")
    spans = sorted((max(s, begin), min(e, end), n) for s, e, n in activities if e > begin and s < end and e >= s)
    if not spans:
        return Timeline(wall_us=end - begin, busy_us=0.0, lead_us=end - begin, tail_us=0.0)
    busy, gaps = 0.0, []
    cur_start, cur_end, cur_name = spans[0]
    for s, e, n in spans[1:]:
        if s <= cur_end:
            if e > cur_end:
                cur_end, cur_name = e, n
            continue
        busy += cur_end - cur_start
        if s - cur_end >= min_gap_us:
            gaps.append(Gap(cur_end, s - cur_end, cur_name, n))
        cur_start, cur_end, cur_name = s, e, n
    busy += cur_end - cur_start
    gaps.sort(key=lambda g: -g.length_us)
    return Timeline(wall_us=end - begin, busy_us=busy, lead_us=spans[0][0] - begin, tail_us=end - cur_end, gaps=gaps)


def profiler_timeline(prof, step_name: str, min_gap_us: float = 5.0) -> Timeline:
    """The Timeline of the host range recorded as `step_name` (torch.profiler.record_function)
    in a finished torch.profiler run `prof`, over its CUDA kernels, copies and sets."""
    from torch.autograd import DeviceType

    events = prof.events()
    steps = [e for e in events if e.name == step_name and e.device_type == DeviceType.CPU]
    if not steps:
        raise ValueError(f"profiler_timeline: no host range named {step_name!r}")
    step = steps[0]
    # NOTE: user annotations on the device timeline (torch.optim's "Optimizer.step#…" range
    # spans the whole step) are not device work: they would hide every gap.
    device = [(e.time_range.start, e.time_range.end, e.name) for e in events
              if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    return device_timeline((step.time_range.start, step.time_range.end), device, min_gap_us)


def format_timeline(t: Timeline, top: int = 6, width: int = 48) -> str:
    """A few lines: wall, busy, idle (lead, between, tail) and the largest gaps."""
    short = lambda name: name if len(name) <= width else name[: width - 1] + "…"  # noqa: E731
    listed = sum(g.length_us for g in t.gaps)
    lines = [f"  device timeline of the step: host range {t.wall_us / 1e3:.2f} ms, device busy {t.busy_us / 1e3:.2f} ms; "
             f"idle {(t.wall_us - t.busy_us) / 1e3:.2f} ms = lead {t.lead_us / 1e3:.2f} (host before the first "
             f"kernel) + {len(t.gaps)} gaps {listed / 1e3:.2f} + rest {(t.wall_us - t.busy_us - t.lead_us - t.tail_us - listed) / 1e3:.2f} "
             f"+ tail {t.tail_us / 1e3:.2f}"]
    for g in t.gaps[:top]:
        lines.append(f"    gap {g.length_us:8.1f} µs  after {short(g.before)}  before {short(g.after)}")
    return "\n".join(lines)
