"""The GPU step against the float64 reference, for the GPU tests (marker gpu).

On the GPU, Gram NS iterates in float16 and standard NS in bfloat16, so one NS output is
within ~1% (fp16) / ~5% (bf16) of the exact one on random inputs. The bound, per step and
parameter: ‖d_gpu − d_exact‖ ≤ 3·‖d_half − d_exact‖ + 1e-3·‖d_exact‖, where d_half is the
plain reference iterating in the same half precision.
"""

from __future__ import annotations

import torch

import dmuon
from worker_tensors import reference_of


def compare_with_reference(shapes, steps: int = 3, ns_dtype=torch.float16, group: dict | None = None,
                           views: dict | None = None, **options):
    """`steps` DMuon steps of float32 CUDA parameters of `shapes` (a list, or name → shape) in
    one Muon group with `group`'s options, the MatrixView `views` (by name) set on them as
    routing would, and DMuon's `options`; each step against the float64 reference and the
    half-precision one on the same gradients; asserts the bound above. Returns (optimizer,
    GPU params, exact reference, its params)."""
    shapes = shapes if isinstance(shapes, dict) else {f"w{i}": s for i, s in enumerate(shapes)}
    gen = torch.Generator().manual_seed(0)
    initial = [torch.randn(*s, generator=gen, dtype=torch.float64) / s[-1] ** 0.5 for s in shapes.values()]
    gpu_p = [torch.nn.Parameter(x.float().cuda()) for x in initial]
    exact_p = [torch.nn.Parameter(x.clone()) for x in initial]
    half_p = [torch.nn.Parameter(x.clone()) for x in initial]
    opt = dmuon.DMuon([{"params": list(zip(shapes, gpu_p)), "use_muon": True, **(group or {})}], **options)
    for name, view in (views or {}).items():
        opt._params.set_view(gpu_p[list(shapes).index(name)], view)  # NOTE: the views routing gives, set directly
    exact, half = reference_of(opt, exact_p), reference_of(opt, half_p, ns_dtype)
    for step in range(steps):  # NOTE: step 1 creates the momentum buffers, 2 and 3 reuse them
        before = [[p.detach().clone().double().cpu() for p in ps] for ps in (gpu_p, exact_p, half_p)]
        for g_p, e_p, h_p in zip(gpu_p, exact_p, half_p):
            grad = torch.randn(e_p.shape, generator=gen, dtype=torch.float64)
            e_p.grad, h_p.grad, g_p.grad = grad.clone(), grad.clone(), grad.float().cuda()
        opt.step()
        exact.step()
        half.step()
        for i, name in enumerate(shapes):
            d_gpu, d_exact, d_half = (ps[i].detach().double().cpu() - b[i]
                                      for ps, b in zip((gpu_p, exact_p, half_p), before))
            assert torch.isfinite(d_gpu).all(), (name, step)
            bound = 3 * (d_half - d_exact).norm() + 1e-3 * d_exact.norm()
            assert (d_gpu - d_exact).norm() <= bound, (name, step, float((d_gpu - d_exact).norm()), float(bound))
    return opt, gpu_p, exact, exact_p
