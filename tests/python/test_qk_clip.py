"""MuonClip's QK-clip (Kimi K2): the factors against the plain reference on one process
and over Gloo (FSDP2 world 2 and 3, DDP world 2), the record API, the hook helper, and
errors that name the option. Scaling is one multiply per element: float32 results agree
to 1e-6 relative."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import dmuon
from dmuon.qk_clip import max_logits_per_head
from dmuon.reference import qk_clip_reference
from clip_workers import Attention, sharded_clip_matches_reference, tp_clip_matches_reference
from dist_harness import run_distributed


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_clip_matches_reference_one_process(num_kv_heads):
    torch.manual_seed(0)
    model = Attention(10, 4, num_kv_heads, 3)
    q0, k0 = model.q_proj.weight.detach().clone(), model.k_proj.weight.detach().clone()
    clip = dmuon.QKClip(tau=5.0, layers={"a": dmuon.QKLayer(q=model.q_proj.weight, k=model.k_proj.weight,
                                                             num_heads=4, num_kv_heads=num_kv_heads, head_dim=3)})
    opt = dmuon.DMuon(model, lr=0.0, qk_clip=clip)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    logits = torch.tensor([1.0, 9.0, 5.0, 20.0])
    clip.record("a", logits)
    opt.step()
    qk_clip_reference(q0, k0, logits.tolist(), 5.0, 4, num_kv_heads, 3)
    torch.testing.assert_close(model.q_proj.weight, q0, rtol=1e-6, atol=0)
    torch.testing.assert_close(model.k_proj.weight, k0, rtol=1e-6, atol=0)
    # Head 3's logits shrink by exactly γ = 5/20 (q·k scales by γ under either rule).
    x = torch.randn(2, 10)
    assert clip.last_max_logits["a"] == logits.tolist()


def test_clip_shrinks_the_logits_to_tau():
    """After the clip, the same inputs give max logits ≤ τ (and the clipped head's = τ)."""
    torch.manual_seed(1)
    model = Attention(16, 4, 2, 8)
    with torch.no_grad():
        model.q_proj.weight.mul_(8.0)
    clip = dmuon.QKClip(tau=3.0, layers={"a": dmuon.QKLayer(q=model.q_proj.weight, k=model.k_proj.weight,
                                                             num_heads=4, num_kv_heads=2, head_dim=8)})
    x = torch.randn(2, 5, 16)

    def logits() -> torch.Tensor:
        q = model.q_proj(x).reshape(2, 5, 4, 8).transpose(1, 2)
        k = model.k_proj(x).reshape(2, 5, 2, 8).transpose(1, 2)
        return max_logits_per_head(q, k)

    before = logits()
    assert bool((before > 3.0).any())
    clip.record("a", before)
    opt = dmuon.DMuon(model, lr=0.0, qk_clip=clip)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = logits()
    expect = torch.where(before > 3.0, torch.full_like(before, 3.0), before)
    torch.testing.assert_close(after, expect, rtol=1e-5, atol=1e-5)


def test_hook_records_max_logits():
    torch.manual_seed(2)
    attn = Attention(6, 2, 2, 3)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj = attn.q_proj, attn.k_proj

        def forward(self, x):
            return self.q_proj(x).sum() + self.k_proj(x).sum()

    block = Block()
    clip = dmuon.QKClip(tau=1e9, layers={"b": dmuon.QKLayer(q=attn.q_proj.weight, k=attn.k_proj.weight,
                                                             num_heads=2, num_kv_heads=2, head_dim=3)})
    handles = clip.attach(block, "b")
    x = torch.randn(1, 4, 6)
    block(x)
    q = attn.q_proj(x).reshape(1, 4, 2, 3).transpose(1, 2)
    k = attn.k_proj(x).reshape(1, 4, 2, 3).transpose(1, 2)
    torch.testing.assert_close(clip._max["b"], max_logits_per_head(q, k))
    for h in handles:
        h.remove()


def test_skipped_step_forgets_the_maxima():
    model = Attention(6, 2, 2, 3)
    q0 = model.q_proj.weight.detach().clone()
    clip = dmuon.QKClip(tau=1.0, layers={"a": dmuon.QKLayer(q=model.q_proj.weight, k=model.k_proj.weight,
                                                             num_heads=2, num_kv_heads=2, head_dim=3)})
    opt = dmuon.DMuon(model, lr=0.0, qk_clip=clip, nonfinite="skip")
    for p in model.parameters():
        p.grad = torch.full_like(p, math.nan)
    clip.record("a", torch.tensor([50.0, 50.0]))
    opt.step()
    assert torch.equal(model.q_proj.weight, q0)
    assert clip._max == {}


@pytest.mark.parametrize("make, name", [
    (lambda a: dmuon.QKClip(tau=0.0, layers={"a": a}), "tau"),
    (lambda a: dmuon.QKClip(tau=1.0, layers={"a": dmuon.QKLayer(q=a.q, k=a.k, num_heads=4, num_kv_heads=3,
                                                                 head_dim=3)}), "num_kv_heads"),
    (lambda a: dmuon.QKClip(tau=1.0, layers={"a": dmuon.QKLayer(q=a.q, k=a.k, num_heads=4, num_kv_heads=2,
                                                                 head_dim=5)}), "rows"),
    (lambda a: dmuon.QKClip(tau=1.0, layers={}), "layers"),
])
def test_bad_clip_options_named(make, name):
    m = Attention(10, 4, 2, 3)
    layer = dmuon.QKLayer(q=m.q_proj.weight, k=m.k_proj.weight, num_heads=4, num_kv_heads=2, head_dim=3)
    with pytest.raises(ValueError, match=name):
        make(layer)


def test_record_checks_the_head_count():
    m = Attention(10, 4, 2, 3)
    clip = dmuon.QKClip(tau=1.0, layers={"a": dmuon.QKLayer(q=m.q_proj.weight, k=m.k_proj.weight, num_heads=4,
                                                             num_kv_heads=2, head_dim=3)})
    with pytest.raises(ValueError, match="4 heads"):
        clip.record("a", torch.ones(3))
    with pytest.raises(KeyError, match="unknown layer"):
        clip.record("b", torch.ones(4))


@pytest.mark.parametrize("wrapper, world, num_kv_heads", [("fsdp2", 2, 2), ("fsdp2", 3, 4), ("ddp", 2, 4)])
def test_clip_distributed_matches_reference(wrapper, world, num_kv_heads):
    results = run_distributed(sharded_clip_matches_reference, world, wrapper, num_kv_heads)
    for rank, r in results.items():
        assert r["q"] <= 1e-6 and r["k"] <= 1e-6, (rank, r)
        assert r["changed"] > 0.0


@pytest.mark.parametrize("num_kv_heads", [2, 4])
def test_clip_under_fsdp2_and_tensor_parallel_matches_reference(num_kv_heads):
    results = run_distributed(tp_clip_matches_reference, 4, num_kv_heads)
    for rank, r in results.items():
        assert "_StridedShard(dim=0" in r["placements"], r  # FSDP2 over TP: the TP chunk split again
        assert r["q"] <= 1e-6 and r["k"] <= 1e-6, (rank, r)
        assert r["changed"] > 0.0, r
