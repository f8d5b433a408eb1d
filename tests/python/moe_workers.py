"""Worker of test_moe_routing (spawned Gloo ranks): the fused and the split MoE blocks under
FSDP2, each expert stack Shard(0) over the ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

import dmuon
import moe_models


def fused_and_split_under_fsdp2(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    fused, split = moe_models.pair(seed=3)
    for block in (fused, split):
        fully_shard(block, mesh=mesh)
    inputs = lambda step: torch.randn(6, moe_models.HIDDEN, generator=torch.Generator().manual_seed(100 * step + rank))
    moe_models.train_pair(fused, split, 3, lambda m: dmuon.DMuon(m, lr=0.05, weight_decay=0.1), inputs)
    full = lambda p: p.full_tensor().detach().clone()  # noqa: E731
    gate, up = full(fused.experts.gate_up_proj).chunk(2, dim=1)
    dist.barrier()
    return {"fused": torch.cat([gate, up]), "split": torch.cat([full(split.experts.gate_proj),
                                                                full(split.experts.up_proj)])}
