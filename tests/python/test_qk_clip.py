"""MuonClip's QK-clip (Kimi K2): the factors against the plain reference on one process
and over Gloo (FSDP2 world 2 and 3, DDP world 2), the record API, the hook helper, and
errors that name the option. Scaling is one multiply per element: float32 results agree
to 1e-6 relative."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from dist_harness import run_distributed
from dmuon.qk_clip import max_logits_per_head
from dmuon.reference import qk_clip_reference
from worker_tensors import whole


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_clip_matches_reference_one_process(num_kv_heads):
    torch.manual_seed(0)
    model = Attention(10, 4, num_kv_heads, 3)
    q0, k0 = model.q_proj.weight.detach().clone(), model.k_proj.weight.detach().clone()
    clip = model.clip(5.0)
    opt = dmuon.DMuon(model, lr=0.0, qk_clip=clip)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    logits = torch.tensor([1.0, 9.0, 5.0, 20.0])
    clip.record("a", logits)
    opt.step()
    qk_clip_reference(q0, k0, logits.tolist(), 5.0, 4, num_kv_heads, 3)
    torch.testing.assert_close(model.q_proj.weight, q0, rtol=1e-6, atol=0)
    torch.testing.assert_close(model.k_proj.weight, k0, rtol=1e-6, atol=0)
    assert clip.last_max_logits["a"] == logits.tolist()


def test_clip_shrinks_the_logits_to_tau():
    """After the clip, the same inputs give max logits ≤ τ (and the clipped head's = τ)."""
    torch.manual_seed(1)
    model = Attention(16, 4, 2, 8)
    with torch.no_grad():
        model.q_proj.weight.mul_(8.0)
    clip = model.clip(3.0)
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
    clip = attn.clip(1e9, "b")
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
    clip = model.clip(1.0)
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
    clip = m.clip(1.0)
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


# ---------------------------------------------------------------- the layer and the ranks
class Attention(nn.Module):
    """q/k projections of a GQA (or multi-head) layer; the step's max logits are given."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.heads = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)

    def clip(self, tau: float, name: str = "a") -> dmuon.QKClip:
        """A QK-clip at `tau` of this layer's q and k (as they are now: sharded, if so) under `name`."""
        return dmuon.QKClip(tau=tau, layers={name: dmuon.QKLayer(q=self.q_proj.weight, k=self.k_proj.weight,
                                                                 **self.heads)})


def sharded_clip_matches_reference(rank: int, world: int, wrapper: str, num_kv_heads: int) -> dict:
    """QK-clip after DMuon steps on a sharded (FSDP2) or replicated (DDP) layer, every rank
    recording its own max logits (rank r's head h: a value of its own), against the plain
    reference with the max over ranks. Returns the largest difference of q and k."""
    torch.manual_seed(0)
    num_heads, head_dim, hidden = 4, 3, 10
    model = Attention(hidden, num_heads, num_kv_heads, head_dim)
    ref = copy.deepcopy(model)
    if wrapper == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    clip = model.clip(5.0, "attn")
    # NOTE: lr 0: the Muon step changes nothing, so the clip alone is compared.
    opt = dmuon.DMuon(model, lr=0.0, qk_clip=clip)
    maxima = torch.tensor([[1.0, 9.0, 4.0, 20.0], [6.0, 2.0, 4.5, 30.0], [0.5, 0.5, 8.0, 1.0]])
    for step in range(2):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        clip.record("attn", maxima[rank] * (step + 1))
        clip.record("attn", maxima[rank] * 0.5)  # a second forward: the step keeps the max
        opt.step()
        agreed = (maxima[:world] * (step + 1)).amax(0)
        qk_clip_reference(ref.q_proj.weight, ref.k_proj.weight, agreed.tolist(), 5.0, num_heads, num_kv_heads,
                          head_dim)
    return {"q": float((whole(model.q_proj.weight) - ref.q_proj.weight).abs().max()),
            "k": float((whole(model.k_proj.weight) - ref.k_proj.weight).abs().max()),
            "changed": float((ref.q_proj.weight - Attention(hidden, num_heads, num_kv_heads, head_dim).q_proj.weight)
                             .abs().max())}


def tp_clip_matches_reference(rank: int, world: int, num_kv_heads: int) -> dict:
    """QK-clip under FSDP2 × TP (a 2 × 2 mesh): q_proj and k_proj column-parallel (their head
    rows split over the TP ranks, then sharded again by FSDP2 over the data-parallel ranks);
    each rank records the maxima of the heads its TP rank computes and -inf for the others.
    Against the reference with the max over the data-parallel ranks."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    torch.manual_seed(0)
    num_heads, head_dim, hidden = 4, 3, 10
    model = Attention(hidden, num_heads, num_kv_heads, head_dim)
    ref = copy.deepcopy(model)
    initial_q = model.q_proj.weight.detach().clone()
    # NOTE: dimension names of this test's own (spawned ranks are pooled: see all_modes_workers).
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("qkclip_dp", "qkclip_tp"))
    parallelize_module(model, mesh["qkclip_tp"], {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel()})
    fully_shard(model, mesh=mesh["qkclip_dp"])
    dp, tp, tp_size = rank // (world // 2), rank % (world // 2), world // 2
    clip = model.clip(5.0, "attn")
    opt = dmuon.DMuon(model, lr=0.0, qk_clip=clip)  # NOTE: lr 0: the clip alone is compared
    maxima = torch.tensor([[1.0, 9.0, 4.0, 20.0], [6.0, 2.0, 4.5, 30.0]])
    mine = torch.full((num_heads,), float("-inf"))
    per_tp = num_heads // tp_size
    mine[tp * per_tp:(tp + 1) * per_tp] = maxima[dp, tp * per_tp:(tp + 1) * per_tp]
    for step in range(2):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        clip.record("attn", mine * (step + 1))
        opt.step()
        qk_clip_reference(ref.q_proj.weight, ref.k_proj.weight, (maxima * (step + 1)).amax(0).tolist(), 5.0,
                          num_heads, num_kv_heads, head_dim)
    return {"q": float((model.q_proj.weight.full_tensor() - ref.q_proj.weight).abs().max()),
            "k": float((model.k_proj.weight.full_tensor() - ref.k_proj.weight).abs().max()),
            "placements": str(model.q_proj.weight.placements),
            "changed": float((ref.q_proj.weight - initial_q).abs().max())}
