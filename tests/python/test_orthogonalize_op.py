"""torch.ops.dmuon_testing.orthogonalize on the CPU: the core backend and the ATen backend (the
simple GPU path, run here on the CPU) against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from dmuon._ops import testing_ops
from ns_helpers import reference, rel, schedule



@pytest.mark.parametrize("algorithm", ["gram", "standard"])
@pytest.mark.parametrize("shape", [(3, 24, 40), (40, 24), (2, 2, 7, 5), (1, 64), (64, 1)])
def test_core_and_aten_backends_match_reference(algorithm, shape):
    x = torch.randn(*shape)
    coefficients, restarts = schedule(algorithm)
    expected = reference(x, algorithm)
    core = testing_ops.orthogonalize(x, algorithm, coefficients, restarts, 1e-7)
    assert core.dtype == torch.float32 and core.shape == x.shape
    assert rel(core, expected) < 5e-4
    aten64 = testing_ops.orthogonalize(x, algorithm, coefficients, restarts, 1e-7, "aten", "float64")
    assert rel(aten64, expected) < 1e-6  # iterated in float64, returned as float32
    # Half-precision iterates (what the GPU path uses): within 3x the error of the plain
    # reference run in the same precision (the steep early polynomials amplify rounding
    # in small singular directions several hundred times, so a few % is inherent).
    half_dtype = torch.float16 if algorithm == "gram" else torch.bfloat16
    half = testing_ops.orthogonalize(x, algorithm, coefficients, restarts, 1e-7, "aten", str(half_dtype).split(".")[1])
    baseline = rel(reference(x, algorithm, half_dtype), expected)
    assert torch.isfinite(half).all() and rel(half, expected) <= 3 * baseline + 1e-3


def test_float64_input_iterates_in_float64():
    x = torch.randn(16, 24, dtype=torch.float64)
    coefficients, restarts = schedule("gram")
    out = testing_ops.orthogonalize(x, "gram", coefficients, restarts, 1e-7)
    assert out.dtype == torch.float64
    assert rel(out, reference(x, "gram")) < 1e-10


def test_nonfinite_input_is_an_error():
    x = torch.randn(2, 8, 8)
    x[1, 3, 3] = float("inf")
    coefficients, restarts = schedule("gram")
    with pytest.raises(RuntimeError, match="non-finite"):
        testing_ops.orthogonalize(x, "gram", coefficients, restarts, 1e-7)
