"""Workers of test_qk_clip.py and of test_normuon.py's gather-mode refusal (spawned Gloo ranks)."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from dmuon.reference import qk_clip_reference
from worker_tensors import whole


class Attention(nn.Module):
    """q/k projections of a GQA (or multi-head) layer; the step's max logits are given."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)


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
    layers = {"attn": dmuon.QKLayer(q=model.q_proj.weight, k=model.k_proj.weight, num_heads=num_heads,
                                    num_kv_heads=num_kv_heads, head_dim=head_dim)}
    clip = dmuon.QKClip(tau=5.0, layers=layers)
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
    layers = {"attn": dmuon.QKLayer(q=model.q_proj.weight, k=model.k_proj.weight, num_heads=num_heads,
                                    num_kv_heads=num_kv_heads, head_dim=head_dim)}
    clip = dmuon.QKClip(tau=5.0, layers=layers)
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


def normuon_gather_refused(rank: int, world: int, wrapper: str) -> str:
    """NorMuon in gather mode (every rank computing every matrix): every rank's error names
    the parameter."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12, bias=False), nn.Linear(12, 8, bias=False))
    if wrapper == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = dmuon.DMuon(model, lr=0.02, normuon=True, mode="gather")
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    try:
        opt.step()
    except Exception as error:  # noqa: BLE001 - the message is what the test checks
        return str(error)
    return ""
