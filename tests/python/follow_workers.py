"""Rank functions of test_followed_params.py: FSDP2's fully_shard applied after DMuon was
made (the caller re-points param_groups at the sharded parameters, as Accelerate does)
against fully_shard before it."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import dmuon
from contract_models import TinyGPT2


def _trained(model: nn.Module, opt: dmuon.DMuon, world: int, rank: int, steps: int) -> None:
    for step in range(steps):
        ids = torch.randint(0, 64, (2 * world, 8), generator=torch.Generator().manual_seed(100 + step))[2 * rank:][:2]
        opt.zero_grad()
        model(ids).square().mean().backward()
        opt.step()


def fully_shard_after_construction(rank: int, world: int, steps: int = 3) -> dict:
    """Every parameter after `steps` steps, both ways (whole tensors), and the names and
    views DMuon gives the sharded parameters."""
    torch.manual_seed(0)
    initial = TinyGPT2(dim=16)
    options = dict(lr=1e-2, weight_decay=0.1, math=dmuon.MuonMath(adjust_lr="original"),
                   execution=dmuon.Execution(planner="lpt"))
    mesh = init_device_mesh("cpu", (world,))

    before = copy.deepcopy(initial)
    fully_shard(before, mesh=mesh)
    opt_before = dmuon.DMuon(before, **options)
    _trained(before, opt_before, world, rank, steps)

    after = copy.deepcopy(initial)
    opt_after = dmuon.DMuon(after, **options)
    name_of = {id(p): n for n, p in after.named_parameters()}
    fully_shard(after, mesh=mesh)
    sharded = dict(after.named_parameters())
    for group in opt_after.param_groups:
        group["params"] = [sharded[name_of[id(p)]] for p in group["params"]]
    _trained(after, opt_after, world, rank, steps)

    out = {"names": {n: opt_after.param_name(p) for n, p in after.named_parameters()},
           "transposed": opt_after.matrix_view(after.c_fc.weight).transposed,
           "differ": []}
    for (name, a), b in zip(after.named_parameters(), before.parameters()):
        if not torch.equal(a.full_tensor(), b.full_tensor()):
            out["differ"].append(name)
    return out
