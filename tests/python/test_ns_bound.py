"""The floor of the fused single-GPU step (csrc/ns/ns_bound.h through dmuon._C), as `bench ns`
prints it: the NS kernels' FLOPs agree with the planner's formulas, their bytes with a count
by hand, bad inputs name their parameter, and the printed line carries the figures."""

import math

import pytest

from dmuon._ops import _C
from dmuon.bench import ns as bench_ns

PEAK, COPY = 775e12, 4.26e12


def test_flops_agree_with_the_planners_formulas_per_iteration():
    # Wide Gram schedules run the cheaper iteration (here Gram); square ones the standard one.
    wide = _C.fused_step_bound([(896, 4864)], "gram", 5, PEAK, COPY)
    assert wide["ns_flops"] == _C.plan.ns_flops(896, 4864, "gram", True)
    square = _C.fused_step_bound([(512, 512)], "gram", 5, PEAK, COPY)
    assert square["ns_flops"] == _C.plan.ns_flops(512, 512, "standard", True)


def test_bytes_and_seconds_add_up():
    m, n = 896, 4864
    b = _C.fused_step_bound([(m, n), (n, m)], "gram", 5, PEAK, COPY)
    # Gram with one restart: 45 m×m and 6 m×n 16-bit passes a matrix (tests/cpp/test_ns_bound.cpp).
    assert b["ns_bytes"] == 2 * (45 * 2 * m * m + 6 * 2 * m * n)
    assert b["pass_bytes"] == 2 * 32 * m * n
    assert math.isclose(b["passes_seconds"], b["pass_bytes"] / COPY)
    assert math.isclose(b["seconds"], b["ns_seconds"] + b["passes_seconds"])
    # The NS floor by primitive: symmetric and dense products, add_identity (Gram only).
    assert math.isclose(b["sym_seconds"] + b["dense_seconds"] + b["elementwise_seconds"], b["ns_seconds"])
    assert min(b["sym_seconds"], b["dense_seconds"], b["elementwise_seconds"]) > 0
    # No kernel runs faster than its FLOPs at the peak or its bytes at the copy rate.
    assert b["ns_seconds"] >= max(b["ns_flops"] / PEAK, b["ns_bytes"] / COPY)


def test_bad_inputs_name_their_parameter():
    with pytest.raises(RuntimeError, match="bytes_per_second"):
        _C.fused_step_bound([(4, 4)], "gram", 5, PEAK, 0.0)
    with pytest.raises(RuntimeError, match="rows and cols"):
        _C.fused_step_bound([(0, 4)], "gram", 5, PEAK, COPY)
    with pytest.raises(RuntimeError, match="ns_algorithm"):
        _C.fused_step_bound([(4, 4)], "polar", 5, PEAK, COPY)


def test_the_printed_line_carries_the_floor_and_the_share():
    b = {"seconds": 7e-3, "ns_seconds": 4.3e-3, "passes_seconds": 2.7e-3, "ns_flops": 3.11e12,
         "ns_bytes": 11.8e9, "pass_bytes": 11.6e9, "sym_seconds": 2.1e-3, "dense_seconds": 2.0e-3,
         "elementwise_seconds": 0.2e-3}
    line = bench_ns.format_floor(b, 10.0)
    assert "7.00 ms = NS 4.30 (symmetric 2.10, dense 2.00, add_identity 0.20) + passes 2.70" in line
    assert "at 70% of it" in line
    assert "3.11 TFLOP and 11.8 GB" in line and "memory passes 11.6 GB" in line


def test_copy_rate_counts_bytes_read_and_written(monkeypatch):
    calls = []

    def fake_time(fn, warmup, iters):
        calls.append((warmup, iters))
        fn()
        return 2.0  # ms

    monkeypatch.setattr(bench_ns, "cuda_time_ms", fake_time)
    # 4 MiB copied in 2 ms: 8 MiB moved.
    assert math.isclose(bench_ns.copy_bandwidth_gbs(4, device="cpu"), 2 * 4 * 2**20 / 2e-3 / 1e9)
    assert calls == [(3, 20)]
