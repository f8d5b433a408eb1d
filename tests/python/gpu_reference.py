"""The GPU step against the float64 reference, for the GPU tests (marker gpu).

On the GPU, Gram NS iterates in float16 and standard NS in bfloat16, so one NS output is
within ~1% (fp16) / ~5% (bf16) of the exact one on random inputs. The bound, per step and
parameter: ‖d_gpu − d_exact‖ ≤ 3·‖d_half − d_exact‖ + 1e-3·‖d_exact‖, where d_half is the
plain reference iterating in the same half precision.
"""

from __future__ import annotations

import torch

import dmuon
from dmuon.reference import ReferenceDMuon


def compare_with_reference(shapes, steps: int = 3, ns_dtype=torch.float16, **options):
    """`steps` DMuon steps of float32 CUDA parameters of `shapes` (DMuon's `options`),
    each against the float64 reference and the half-precision one on the same gradients;
    asserts the bound above. Returns (optimizer, GPU params, exact reference, its params)."""
    initial = [torch.randn(*s, dtype=torch.float64) / s[-1] ** 0.5 for s in shapes]
    gpu_p = [torch.nn.Parameter(x.float().cuda()) for x in initial]
    exact_p = [torch.nn.Parameter(x.clone()) for x in initial]
    half_p = [torch.nn.Parameter(x.clone()) for x in initial]
    opt = dmuon.DMuon(gpu_p, **options)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    exact = ReferenceDMuon([dict(group, params=exact_p)])
    half = ReferenceDMuon([dict(group, params=half_p)], ns_dtype=ns_dtype)
    for step in range(steps):
        before = [[p.detach().clone().double().cpu() for p in ps] for ps in (gpu_p, exact_p, half_p)]
        for g_p, e_p, h_p in zip(gpu_p, exact_p, half_p):
            grad = torch.randn_like(e_p)
            e_p.grad, h_p.grad, g_p.grad = grad.clone(), grad.clone(), grad.float().cuda()
        opt.step()
        exact.step()
        half.step()
        for i, shape in enumerate(shapes):
            d_gpu, d_exact, d_half = (ps[i].detach().double().cpu() - b[i]
                                      for ps, b in zip((gpu_p, exact_p, half_p), before))
            assert torch.isfinite(d_gpu).all(), (shape, step)
            bound = 3 * (d_half - d_exact).norm() + 1e-3 * d_exact.norm()
            assert (d_gpu - d_exact).norm() <= bound, (shape, step, float((d_gpu - d_exact).norm()), float(bound))
    return opt, gpu_p, exact, exact_p
