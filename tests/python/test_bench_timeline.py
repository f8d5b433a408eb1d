"""The device-timeline reduction of `bench ns --profile` (dmuon/cli/bench/timeline.py), on
synthetic intervals: busy time is the union of overlapping activities, gaps are listed
largest first with their neighbours, and the host time around the device work is split
into lead and tail."""

import pytest

from dmuon.cli.bench.timeline import device_timeline, format_timeline


def test_union_gaps_lead_and_tail():
    # Host range 0–100 µs; two overlapping kernels (streams), a 20 µs gap, a 3 µs gap.
    acts = [(10, 30, "a"), (25, 40, "b"), (60, 70, "c"), (73, 90, "d")]
    t = device_timeline((0, 100), acts)
    assert t.wall_us == 100
    assert t.busy_us == pytest.approx(30 + 10 + 17)
    assert t.lead_us == 10 and t.tail_us == 10
    assert [(g.length_us, g.before, g.after) for g in t.gaps] == [(20, "b", "c"), (3, "c", "d")]
    assert t.idle_between_us == 23
    assert t.wall_us == pytest.approx(t.busy_us + t.lead_us + t.idle_between_us + t.tail_us)


def test_min_gap_hides_short_gaps_but_keeps_totals():
    t = device_timeline((0, 100), [(10, 30, "a"), (33, 50, "b"), (80, 95, "c")], min_gap_us=5)
    assert [g.length_us for g in t.gaps] == [30]
    assert t.busy_us == 20 + 17 + 15
    assert "rest 0.00" in format_timeline(t)  # 3 µs of unlisted gaps: 0.003 ms


def test_activities_clipped_to_the_host_range_and_empty():
    t = device_timeline((10, 50), [(0, 20, "before"), (45, 70, "after"), (80, 90, "outside")])
    assert t.busy_us == 10 + 5 and t.lead_us == 0 and t.tail_us == 0
    empty = device_timeline((0, 40), [])
    assert empty.busy_us == 0 and empty.lead_us == 40 and empty.gaps == []
    with pytest.raises(ValueError, match="host_range"):
        device_timeline((5, 1), [])


def test_format_lists_largest_gaps_with_neighbours():
    t = device_timeline((0, 1000), [(0, 100, "check_partials"), (600, 700, "normalized_update"),
                                    (710, 1000, "sym_product_kernel")])
    text = format_timeline(t, top=1)
    assert "gap    500.0 µs  after check_partials  before normalized_update" in text
    assert "710.0" not in text  # only the largest gap is listed


def test_profiler_timeline_reads_a_real_profile():
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from dmuon.cli.bench.timeline import profiler_timeline

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("the step"):
            torch.ones(64, 64).sum()
    t = profiler_timeline(prof, "the step")
    assert t.wall_us > 0 and t.busy_us == 0 and t.lead_us == t.wall_us  # CPU only: no device work
    with pytest.raises(ValueError, match="no host range named"):
        profiler_timeline(prof, "another step")
