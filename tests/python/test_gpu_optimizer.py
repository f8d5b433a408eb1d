"""DMuon on one CUDA GPU against the float64 reference (marker gpu; skipped without a GPU).

On the GPU, Gram NS iterates in float16 and standard NS in bfloat16, so one NS output is
within ~1% (fp16) / ~5% (bf16) of the exact one on random inputs, far less after the lr
scaling. The bound: per step, ‖d_gpu − d_exact‖ ≤ 3·‖d_half_ref − d_exact‖ + 1e-3·‖d_exact‖,
where d_half_ref is the plain reference iterating in the same half precision.
"""

from __future__ import annotations

import pytest
import torch

import dmuon
from dmuon._ops import _C, ops
from dmuon.reference import ReferenceDMuon

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("algorithm", ["gram", "standard"])
def test_gpu_step_matches_reference_within_half_precision(algorithm):
    shapes = [(64, 96), (96, 64), (127, 301), (5, 7), (3, 8, 16)]
    initial = [torch.randn(*s, dtype=torch.float64) / s[-1] ** 0.5 for s in shapes]
    gpu_p = [torch.nn.Parameter(x.float().cuda()) for x in initial]
    exact_p = [torch.nn.Parameter(x.clone()) for x in initial]
    half_p = [torch.nn.Parameter(x.clone()) for x in initial]
    opt = dmuon.DMuon(gpu_p, lr=0.02, weight_decay=0.0, ns_algorithm=algorithm)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    exact = ReferenceDMuon([dict(group, params=exact_p)])
    half = ReferenceDMuon([dict(group, params=half_p)],
                          ns_dtype=torch.float16 if algorithm == "gram" else torch.bfloat16)
    for _ in range(3):
        before = [[p.detach().clone().double().cpu() for p in ps] for ps in (gpu_p, exact_p, half_p)]
        for g_p, e_p, h_p in zip(gpu_p, exact_p, half_p):
            grad = torch.randn_like(e_p)
            e_p.grad, h_p.grad, g_p.grad = grad.clone(), grad.clone(), grad.float().cuda()
        opt.step()
        exact.step()
        half.step()
        for i in range(len(shapes)):
            d_gpu, d_exact, d_half = (ps[i].detach().double().cpu() - b[i] for ps, b in zip((gpu_p, exact_p, half_p), before))
            assert torch.isfinite(d_gpu).all()
            bound = 3 * (d_half - d_exact).norm() + 1e-3 * d_exact.norm()
            assert (d_gpu - d_exact).norm() <= bound, (algorithm, shapes[i])


def test_gpu_orthogonalize_writes_every_element_and_batches_like_a_loop():
    coefficients, restarts = _C.default_schedule("gram", 5)
    flat = [x for c in coefficients for x in c]
    x = torch.randn(16, 127, 1001, device="cuda")
    batched = ops.orthogonalize(x, "gram", flat, list(restarts), 1e-7)
    looped = torch.stack([ops.orthogonalize(m, "gram", flat, list(restarts), 1e-7) for m in x])
    assert torch.isfinite(batched).all()
    torch.testing.assert_close(batched, looped, atol=2e-3, rtol=0)
