"""The floor of the fused single-GPU step (csrc/ns/ns_bound.h through dmuon._C), as `bench ns`
prints it: the NS kernels' FLOPs agree with the planner's formulas, their bytes with a count
by hand, bad inputs name their parameter, and the printed line carries the figures."""

import math

import pytest

from dmuon._ops import _C
from dmuon.cli.bench import ns as bench_ns

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


def test_step_products_list_each_distinct_product_once():
    products = _C.step_products([(8, 896, 4864), (8, 4864, 896), (3, 512, 512)], "gram", 5)
    keys = [tuple(sorted(p.items())) for p in products]
    assert len(keys) == len(set(keys))
    assert {p["kind"] for p in products} == {"symmetric", "dense"}
    # The square batch runs the standard iteration: X·Xᵀ, A² + b·A and B·X + a·X.
    square = [p for p in products if p["batch"] == 3]
    assert sorted((p["kind"], p["k"], p["with_c"]) for p in square) == [
        ("dense", 512, True), ("symmetric", 512, False), ("symmetric", 512, True)]
    assert all(p["m"] == 896 for p in products if p["batch"] == 8)
    assert any(p["kind"] == "symmetric" and p["k"] == 4864 and p["same_operands"] for p in products)


def test_measured_floor_at_one_rate_is_the_peak_floor():
    # Every product "timed" at its dense FLOPs at PEAK: the measured floor is fused_step_bound's.
    batches = [(4, 896, 4864), (2, 896, 896), (3, 128, 896)]
    timed = []

    def fake_time(product, dtype, iters):
        timed.append((product["kind"], dtype))
        at_peak = 2.0 * product["batch"] * product["m"] * product["n"] * product["k"] / PEAK
        # cuBLASLt's algorithms: slower for dense products, not measured for symmetric ones.
        return at_peak, (2 * at_peak if product["kind"] == "dense" else float("nan"))

    measured = bench_ns.measured_floor(batches, "gram", 5, COPY / 1e9, time_product=fake_time)
    peak = _C.fused_step_bound([(r, c) for b, r, c in batches for _ in range(b)], "gram", 5, PEAK, COPY)
    for key in ("seconds", "sym_seconds", "dense_seconds", "elementwise_seconds", "passes_seconds"):
        assert math.isclose(measured[key], peak[key], rel_tol=1e-9), key
    assert math.isclose(measured["torch_seconds"], peak["seconds"], rel_tol=1e-9)
    assert measured["products"] == len(timed) == len(_C.step_products(batches, "gram", 5))
    assert measured["lt_faster"] == 0
    assert {dtype for _, dtype in timed} == {bench_ns.torch.float16}  # Gram iterates in fp16
    with pytest.raises(RuntimeError, match="dense_seconds"):
        _C.measured_step_bound(batches, "gram", 5, [1e-3], COPY)


def test_measured_floor_takes_the_faster_library_time_per_product():
    batches = [(2, 256, 1024)]

    def fake_time(product, dtype, iters):
        torch_s = 1e-3
        return torch_s, (0.5e-3 if product["kind"] == "dense" else 2e-3)

    measured = bench_ns.measured_floor(batches, "gram", 5, COPY / 1e9, time_product=fake_time)
    dense = [p for p in _C.step_products(batches, "gram", 5) if p["kind"] == "dense"]
    assert measured["lt_faster"] == len(dense) > 0
    assert measured["seconds"] < measured["torch_seconds"]
    # The symmetric part is at torch's times (half of 1 ms each), the dense at 0.5 ms each.
    torch_only = _C.measured_step_bound(batches, "gram", 5, [1e-3] * measured["products"], COPY)
    assert math.isclose(measured["sym_seconds"], torch_only["sym_seconds"])
    assert measured["dense_seconds"] < torch_only["dense_seconds"]


def test_dense_product_seconds_times_the_right_product(monkeypatch):
    shapes = []

    def fake_time(fn, warmup, iters):
        shapes.append(tuple(fn().shape))
        return 1.5

    monkeypatch.setattr(bench_ns, "cuda_time_ms", fake_time)
    sym = {"kind": "symmetric", "batch": 2, "m": 8, "n": 8, "k": 24, "with_c": False, "same_operands": True}
    dense = {"kind": "dense", "batch": 2, "m": 8, "n": 24, "k": 8, "with_c": True, "same_operands": False}
    for p in (sym, dense):
        torch_s, lt_s = bench_ns.dense_product_seconds(p, bench_ns.torch.float32, device="cpu")
        assert torch_s == 1.5e-3 and math.isnan(lt_s)  # no cuBLASLt on the CPU
    assert shapes == [(2, 8, 8), (2, 8, 24)]


def test_the_measured_floor_line_carries_its_figures():
    b = {"seconds": 40e-3, "ns_seconds": 30e-3, "passes_seconds": 10e-3, "sym_seconds": 16e-3,
         "dense_seconds": 13.6e-3, "elementwise_seconds": 0.4e-3, "products": 17, "lt_faster": 5,
         "torch_seconds": 42e-3}
    line = bench_ns.format_measured_floor(b, 50.0)
    assert "40.00 ms = NS 30.00 (symmetric 16.00, dense 13.60, add_identity 0.40) + passes 10.00" in line
    assert "17 distinct products" in line and "faster for 5" in line and "alone 42.00" in line
    assert "at 80% of it" in line
