"""`bench ns`'s timing in turns (dmuon/cli/bench/timing.py: alternating_ms, interleaved_ms): the methods are
timed in turns, a round each, and each gets the median of its own rounds. The CUDA-event
timer is replaced by a recorder, so this runs without a GPU."""

from dmuon.cli.bench import timing


def test_rounds_alternate_and_each_side_gets_its_own_median(monkeypatch):
    calls = []
    # Per side, the times its rounds return in order: a clock that drifts down over the run.
    times = {"a": iter([9.0, 5.0, 7.0, 6.0, 8.0]), "b": iter([4.0, 2.0, 3.0, 1.0, 5.0])}

    def fake_time(fn, warmup, iters):
        side = fn()
        calls.append((side, warmup, iters))
        return next(times[side])

    monkeypatch.setattr(timing, "cuda_time_ms", fake_time)
    a_ms, b_ms = timing.alternating_ms(lambda: "a", lambda: "b", iters=12)
    assert [side for side, _, _ in calls] == ["a", "b"] * 5
    assert all(warmup == 1 and iters == 12 for _, warmup, iters in calls)
    assert (a_ms, b_ms) == (7.0, 3.0)


def test_round_count(monkeypatch):
    calls = []
    monkeypatch.setattr(timing, "cuda_time_ms", lambda fn, warmup, iters: calls.append(fn()) or 1.0)
    assert timing.alternating_ms(lambda: "a", lambda: "b", iters=3, rounds=2) == (1.0, 1.0)
    assert calls == ["a", "b", "a", "b"]


def test_interleaved_rounds_rotate_the_order_and_each_name_gets_its_own_median(monkeypatch):
    """sym_kernel_bench's timing: every function once a round, round r starting at the r-th
    function, per-name timing counts, and the median of each name's own rounds."""
    calls = []
    times = {"x": iter([3.0, 1.0, 2.0]), "y": iter([6.0, 4.0, 5.0]), "z": iter([9.0, 7.0, 8.0])}

    def fake_time(fn, warmup, iters):
        name = fn()
        calls.append((name, warmup, iters))
        return next(times[name])

    monkeypatch.setattr(timing, "cuda_time_ms", fake_time)
    fns = {name: (lambda name=name: name) for name in ("x", "y", "z")}
    out = timing.interleaved_ms(fns, {"x": 5, "y": 7, "z": 9}, rounds=3)
    assert [name for name, _, _ in calls] == ["x", "y", "z", "y", "z", "x", "z", "x", "y"]
    assert all(warmup == 1 and iters == {"x": 5, "y": 7, "z": 9}[name] for name, warmup, iters in calls)
    assert out == {"x": 2.0, "y": 5.0, "z": 8.0}
