"""DMuon on one CUDA GPU against the float64 reference (marker gpu; skipped without a GPU).

On the GPU, Gram NS iterates in float16 and standard NS in bfloat16, so one NS output is
within ~1% (fp16) / ~5% (bf16) of the exact one on random inputs, far less after the lr
scaling: the bound of gpu_reference.compare_with_reference.
"""

from __future__ import annotations

import pytest
import torch

import dmuon
from dmuon._ops import _C, testing_ops
from gpu_reference import compare_with_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("algorithm", ["gram", "standard"])
def test_gpu_step_matches_reference_within_half_precision(algorithm):
    compare_with_reference([(64, 96), (96, 64), (127, 301), (5, 7), (3, 8, 16)],
                           ns_dtype=torch.float16 if algorithm == "gram" else torch.bfloat16,
                           lr=0.02, weight_decay=0.0, ns_algorithm=algorithm)


def test_gpu_orthogonalize_writes_every_element_and_batches_like_a_loop():
    coefficients, restarts = _C.default_schedule("gram", 5)
    flat = [x for c in coefficients for x in c]
    x = torch.randn(16, 127, 1001, device="cuda")
    batched = testing_ops.orthogonalize(x, "gram", flat, list(restarts), 1e-7)
    looped = torch.stack([testing_ops.orthogonalize(m, "gram", flat, list(restarts), 1e-7) for m in x])
    assert torch.isfinite(batched).all()
    torch.testing.assert_close(batched, looped, atol=2e-3, rtol=0)
