"""Worker functions of the torch.optim contract's distributed tests (tests/python/
test_rank_agreement.py), run in Gloo CPU processes by dist_harness.run_distributed."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import dmuon
from contract_models import TinyDecoder
from dmuon.reference import ReferenceDMuon
from worker_tensors import reference_of


def _loss_step(model, optimizer, ids) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).mean().backward()
    optimizer.step()


def _step_outcome(model, step) -> dict:
    """step()'s error ("" when it passed) and whether every parameter of `model` is unchanged."""
    before = [p.detach().clone() for p in model.parameters()]
    try:
        step()
        error = ""
    except RuntimeError as e:
        error = str(e)
    return {"error": error, "unchanged": all(torch.equal(p, b) for p, b in zip(model.parameters(), before))}


def replicas_that_differ_are_refused(rank: int, world: int) -> dict:
    """Every rank builds its own model (a seed sweep): DMuon on the default group refuses it on
    every rank; with process_group="local" each rank trains its own model exactly."""
    torch.manual_seed(100 + rank)
    model = TinyDecoder()
    out = {}
    try:
        dmuon.DMuon(model, lr=0.02)
        out["error"] = ""
    except ValueError as error:
        out["error"] = str(error)
    optimizer = dmuon.DMuon(model, lr=0.02, process_group="local")
    exact = copy.deepcopy(model)
    reference = reference_of(optimizer, exact)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        _loss_step(model, optimizer, ids)
        exact.zero_grad(set_to_none=True)
        exact(ids).logsumexp(-1).mean().backward()
        reference.step()
    out["max_error"] = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), exact.parameters()))
    out["runtime_world"] = optimizer.runtime.world_size
    return out


def equal_replicas_pass(rank: int, world: int) -> int:
    torch.manual_seed(7)
    optimizer = dmuon.DMuon(TinyDecoder(), lr=0.02)
    return optimizer.runtime.world_size


def add_param_group_on_some_ranks(rank: int, world: int) -> dict:
    """Rank 0 alone adds a group: the next step raises on every rank, naming the group, and
    changes nothing."""
    torch.manual_seed(7)
    model = TinyDecoder()
    optimizer = dmuon.DMuon(model, lr=0.02)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0))
    _loss_step(model, optimizer, ids)
    if rank == 0:
        optimizer.add_param_group({"params": [("extra.weight", nn.Parameter(torch.randn(8, 8)))], "use_muon": True})
    return _step_outcome(model, lambda: _loss_step(model, optimizer, ids))


def a_failed_check_on_one_rank_stops_every_rank(rank: int, world: int) -> dict:
    """Rank 1's AdamW state is corrupt: every rank raises before writing, naming it."""
    torch.manual_seed(7)
    model = TinyDecoder()
    optimizer = dmuon.DMuon(model, lr=0.02)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0))
    _loss_step(model, optimizer, ids)
    optimizer.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).mean().backward()
    if rank == 1:
        optimizer.state[model.lm_head.weight]["exp_avg"] = torch.zeros(3, 3)
    return _step_outcome(model, optimizer.step)


def row_blocks_sharded_match_the_reference(rank: int, world: int) -> dict:
    """Row-block matrices sharded on dim 0 across block boundaries (FSDP2's Shard(0)): a fused
    q, k, v (three equal blocks, from its name) and blocks of different rows (the layout a later
    split orthogonalization passes), against the single-process reference."""
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(3)
    initial = {"attn.in_proj_weight": torch.randn(15, 5, generator=gen) / 5 ** 0.5,
               "attn.fused_gqa": torch.randn(16, 6, generator=gen) / 6 ** 0.5}
    blocks = {"attn.in_proj_weight": (5, 5, 5), "attn.fused_gqa": (8, 4, 4)}
    params = {n: nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for n, t in initial.items()}
    # NOTE: the fused GQA's unequal blocks come from the split_rows group option.
    optimizer = dmuon.DMuon([{"params": [("attn.in_proj_weight", params["attn.in_proj_weight"])], "use_muon": True},
                             {"params": [("attn.fused_gqa", params["attn.fused_gqa"])], "use_muon": True,
                              "split_rows": [8, 4, 4]}],
                            lr=0.05, weight_decay=0.1, adjust_lr="original", ns_algorithm="standard")
    views = {n: optimizer.matrix_view(p) for n, p in params.items()}
    exact = {n: nn.Parameter(t.clone()) for n, t in initial.items()}
    options = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    reference = ReferenceDMuon([{**options, "params": list(exact.values()),
                                 "row_blocks": [blocks[n] for n in exact]}])
    for step in range(3):
        for n, p in params.items():
            g = torch.randn(initial[n].shape, generator=torch.Generator().manual_seed(10 * step + len(n)))
            p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
            exact[n].grad = g.clone()
        optimizer.step()
        reference.step()
    errors = {n: float((params[n].full_tensor() - exact[n]).abs().max()) for n in params}
    return {"errors": errors, "qkv_blocks": views["attn.in_proj_weight"].row_blocks,
            "gqa_blocks": views["attn.fused_gqa"].row_blocks,
            "local_rows": {n: p.to_local().shape[0] for n, p in params.items()}}


def adamw_gradient_on_some_ranks_only(rank: int, world: int) -> dict:
    """Rank 0 alone has a gradient for an AdamW parameter (the embedding): the step raises
    on every rank, naming it, and changes nothing (the engine agrees on the presence of
    the gradients it only checks, as on the Muon parameters')."""
    torch.manual_seed(7)
    model = TinyDecoder()
    optimizer = dmuon.DMuon(model, lr=0.02)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0))
    optimizer.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).mean().backward()
    if rank == 1:
        model.embed_tokens.weight.grad = None
    return {**_step_outcome(model, optimizer.step),
            "adamw": not any(g["use_muon"] for g in optimizer.param_groups
                             if any(p is model.embed_tokens.weight for p in g["params"]))}
