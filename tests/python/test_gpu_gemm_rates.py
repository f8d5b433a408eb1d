"""The GEMM timings behind `bench ns`'s floor at this GPU's GEMM rates: every cuBLASLt
heuristic algorithm of a product timed (torch.ops.dmuon_testing.cuda_gemm_algo_ms), bad operands named,
and the benchmark's helper timing both torch's GEMM and those algorithms."""

from __future__ import annotations

import math

import pytest
import torch

from dmuon._ops import testing_ops
from dmuon.bench import ns as bench_ns

pytestmark = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
@pytest.mark.parametrize("transpose_b, with_c", [(True, False), (False, True)])
def test_every_algorithm_of_a_product_is_timed(transpose_b, with_c):
    a = torch.randn(3, 128, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(3, 128, 256, device="cuda", dtype=torch.float16) if transpose_b else \
        torch.randn(3, 256, 192, device="cuda", dtype=torch.float16)
    n = 128 if transpose_b else 192
    c = torch.randn(3, 128, n, device="cuda", dtype=torch.float16) if with_c else None
    times = testing_ops.cuda_gemm_algo_ms(a, b, c, 0.5 if with_c else 0.0, transpose_b)
    finite = [t for t in times if not math.isnan(t)]
    assert 1 <= len(times) <= 8 and finite
    assert all(0 < t < 1000 for t in finite)


@needs_gpu
def test_bad_operands_are_named():
    a = torch.randn(2, 64, 32, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="B must be"):
        testing_ops.cuda_gemm_algo_ms(a, torch.randn(2, 16, 64, device="cuda", dtype=torch.float16), None, 0.0, False)
    with pytest.raises(RuntimeError, match="both float16 or both bfloat16"):
        testing_ops.cuda_gemm_algo_ms(a.float(), a.float(), None, 0.0, True)
    with pytest.raises(RuntimeError, match="C must be"):
        testing_ops.cuda_gemm_algo_ms(a, a, torch.randn(2, 64, 32, device="cuda", dtype=torch.float16), 0.5, True)


@needs_gpu
def test_the_benchmark_times_torch_and_the_algorithms():
    product = {"kind": "symmetric", "batch": 4, "m": 256, "n": 256, "k": 1024, "with_c": True,
               "same_operands": False}
    torch_s, lt_s = bench_ns.dense_product_seconds(product, torch.float16, iters=3)
    assert 0 < torch_s < 1 and 0 < lt_s < 1
