"""Data parallelism for the training job: wrap the model (FSDP2 or DDP), slice batches,
and average scalars across ranks. With world 1 everything is the identity."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dmuon.cli.train.config import TrainConfig


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def wrap_model(model: nn.Module, config: TrainConfig) -> nn.Module:
    """FSDP2 (fully_shard on every block, then the root) or DDP over all ranks."""
    if not is_distributed():
        return model
    if config.parallel == "ddp":
        device_ids = [torch.cuda.current_device()] if config.device.startswith("cuda") else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if config.device.startswith("cuda") else "cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def local_slice(batch: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous share of a global batch (dim 0)."""
    if not is_distributed():
        return batch
    world, rank = dist.get_world_size(), dist.get_rank()
    per_rank = batch.shape[0] // world
    return batch[rank * per_rank:(rank + 1) * per_rank]


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar over ranks (NOTE: SUM then divide; Gloo has no AVG)."""
    if not is_distributed():
        return float(value.detach())
    total = value.detach().clone().float().reshape(1)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total) / dist.get_world_size()


def is_main_rank() -> bool:
    return not is_distributed() or dist.get_rank() == 0
