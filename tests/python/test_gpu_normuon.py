"""NorMuon and QK-clip on one CUDA GPU (marker gpu; skipped without a GPU).

NorMuon: the CUDA step iterates in float16 (Gram NS), so one update is within ~1% of the
float64 one; NorMuon's row factors are ratios of row norms of that same update. Bound: that
of gpu_reference.compare_with_reference; v within 5% relative. QK-clip: one multiply per
element, 1e-6."""

from __future__ import annotations

import pytest
import torch

import dmuon
from dmuon.reference import qk_clip_reference
from gpu_reference import compare_with_reference

pytestmark = pytest.mark.gpu


def test_gpu_normuon_matches_reference_within_half_precision():
    shapes = [(64, 96), (96, 64), (127, 301), (3, 8, 16)]
    opt, gpu_p, exact, exact_p = compare_with_reference(shapes, lr=0.02, weight_decay=0.0, normuon=True)
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
