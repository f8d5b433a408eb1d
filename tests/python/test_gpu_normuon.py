"""NorMuon and QK-clip on one CUDA GPU (marker gpu; skipped without a GPU).

NorMuon: the CUDA step iterates in float16 (Gram NS), so one update is within ~1% of the
float64 one; NorMuon's row factors are ratios of row norms of that same update. Bound: the
GPU update within 3× the half-precision reference's error plus 1e-3 relative, as
test_gpu_optimizer; v within 5% relative. QK-clip: one multiply per element, 1e-6."""

from __future__ import annotations

import pytest
import torch

import dmuon
from dmuon.reference import ReferenceDMuon, qk_clip_reference

pytestmark = pytest.mark.gpu


def test_gpu_normuon_matches_reference_within_half_precision():
    shapes = [(64, 96), (96, 64), (127, 301), (3, 8, 16)]
    initial = [torch.randn(*s, dtype=torch.float64) / s[-1] ** 0.5 for s in shapes]
    gpu_p = [torch.nn.Parameter(x.float().cuda()) for x in initial]
    exact_p = [torch.nn.Parameter(x.clone()) for x in initial]
    half_p = [torch.nn.Parameter(x.clone()) for x in initial]
    opt = dmuon.DMuon(gpu_p, lr=0.02, weight_decay=0.0, normuon=True)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    exact = ReferenceDMuon([dict(group, params=exact_p)])
    half = ReferenceDMuon([dict(group, params=half_p)], ns_dtype=torch.float16)
    for _ in range(3):
        before = [[p.detach().clone().double().cpu() for p in ps] for ps in (gpu_p, exact_p, half_p)]
        for g_p, e_p, h_p in zip(gpu_p, exact_p, half_p):
            grad = torch.randn_like(e_p)
            e_p.grad, h_p.grad, g_p.grad = grad.clone(), grad.clone(), grad.float().cuda()
        opt.step()
        exact.step()
        half.step()
        for k in range(len(shapes)):
            d_gpu = gpu_p[k].detach().double().cpu() - before[0][k]
            d_exact = exact_p[k].detach() - before[1][k]
            d_half = half_p[k].detach() - before[2][k]
            bound = 3 * (d_half - d_exact).norm() + 1e-3 * d_exact.norm()
            assert (d_gpu - d_exact).norm() <= bound, (shapes[k], float((d_gpu - d_exact).norm()), float(bound))
    for k in range(len(shapes)):
        v_gpu = opt.state[gpu_p[k]]["normuon_v"].cpu()
        v_ref = exact.state[id(exact_p[k])]["normuon_v"]
        torch.testing.assert_close(v_gpu, v_ref, rtol=5e-2, atol=1e-6)


def test_gpu_qk_clip_matches_reference():
    q = torch.nn.Parameter(torch.randn(4 * 8, 32, device="cuda"))
    k = torch.nn.Parameter(torch.randn(2 * 8, 32, device="cuda"))
    q_ref, k_ref = q.detach().cpu().clone(), k.detach().cpu().clone()
    clip = dmuon.QKClip(tau=10.0, layers={"a": dmuon.QKLayer(q=q, k=k, num_heads=4, num_kv_heads=2, head_dim=8)})
    opt = dmuon.DMuon([q, k], lr=0.0, qk_clip=clip)
    q.grad, k.grad = torch.zeros_like(q), torch.zeros_like(k)
    logits = torch.tensor([3.0, 12.0, 40.0, 9.0], device="cuda")
    clip.record("a", logits)
    opt.step()
    qk_clip_reference(q_ref, k_ref, logits.tolist(), 10.0, 4, 2, 8)
    torch.testing.assert_close(q.detach().cpu(), q_ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(k.detach().cpu(), k_ref, rtol=1e-6, atol=0)
