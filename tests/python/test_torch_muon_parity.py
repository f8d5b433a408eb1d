"""Configured as torch.optim.Muon, DMuon reproduces its parameters step for step.

torch.optim.Muon iterates in bfloat16 and DMuon's CPU core in float32, so each is bounded
on its own against the exact update, per step and per parameter, with d = the parameter's
change in that step and d_exact from the float64 reference configured the same way:
  ‖d_torch − d_exact‖ ≤ 6e-2·‖d_exact‖   (torch sits 1.7–3.9% from exact on these shapes;
                                          3× lr, flipped nesterov, momentum 0.5, no weight
                                          decay, another adjust_lr or one NS step: ≥ 12%)
  ‖d_dmuon − d_exact‖ ≤ 1e-3·‖d_exact‖   (float32 accuracy)
so that torch.optim.Muon misconfigured here (or DMuon's reading of its options) fails.
Gradients are random and shared by all three, so the momentum buffers (and NS inputs) are
identical.
"""

from __future__ import annotations

import pytest
import torch

import dmuon
from dmuon.reference import KELLER_JORDAN, ReferenceDMuon

TORCH_TOLERANCE = 6e-2


@pytest.mark.parametrize("shapes", [[(32, 48), (48, 32), (40, 40)], [(5, 7), (1, 64), (3, 100)]],
                         ids=["square-ish", "awkward"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_matches_torch_muon_step_for_step(shapes, nesterov):
    lr, wd = 0.02, 0.1
    initial = [torch.randn(*s) / s[1] ** 0.5 for s in shapes]
    ours_p = [torch.nn.Parameter(x.clone()) for x in initial]
    torch_p = [torch.nn.Parameter(x.clone()) for x in initial]
    exact_p = [torch.nn.Parameter(x.clone()) for x in initial]
    ours = dmuon.DMuon(ours_p, lr=lr, weight_decay=wd, momentum=0.95, nesterov=nesterov,
                       ns_algorithm="standard", ns_coefficients=[KELLER_JORDAN], ns_steps=5,
                       eps=1e-7, adjust_lr="original")
    theirs = torch.optim.Muon(torch_p, lr=lr, weight_decay=wd, momentum=0.95, nesterov=nesterov,
                              adjust_lr_fn="original")
    exact_groups = [dict(ours.param_groups[0], params=exact_p)]
    exact = ReferenceDMuon(exact_groups)

    for step in range(5):
        grads = [torch.randn_like(x) for x in initial]
        before = [[p.detach().clone() for p in ps] for ps in (ours_p, torch_p, exact_p)]
        for ps in (ours_p, torch_p, exact_p):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
        ours.step()
        theirs.step()
        exact.step()
        for i, shape in enumerate(shapes):
            d_ours, d_torch, d_exact = (ps[i].detach() - b[i] for ps, b in zip((ours_p, torch_p, exact_p), before))
            scale = d_exact.norm()
            assert scale > 0
            torch_error = float((d_torch - d_exact).norm() / scale)
            assert torch_error <= TORCH_TOLERANCE, (step, shape, torch_error)
            assert (d_ours - d_exact).norm() <= 1e-3 * scale, (step, shape)
