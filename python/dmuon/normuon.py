"""NorMuon's optimizer state (Li et al., 2025, "NorMuon: Making Muon more efficient and
scalable"): ``normuon_v``, one float32 second moment per row of every matrix of a Muon
parameter. Rows are the parameter's rows as stored (a Linear weight's output neurons), so
v has the shape of the parameter's leading dims: [out] for a matrix (trailing dims
flattened), [E, rows] for a stack. The math is in C++ (csrc/optim/normuon.h); the
plain-loop version is dmuon.reference.normuon_update.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor import zeros as dtensor_zeros


def normuon_state_shape(param: torch.Tensor, batch_dims: int) -> tuple[int, ...]:
    """The shape of `param`'s normuon_v: its first 1 + batch_dims dims."""
    return tuple(param.shape[:1 + batch_dims])


def normuon_state_like(param: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """Zeros for `param`'s normuon_v; a DTensor's is placed like its rows (a Shard(d) of the
    leading dims stays, any other placement replicates)."""
    shape = normuon_state_shape(param, batch_dims)
    if isinstance(param, DTensor):
        placements = [p if isinstance(p, Shard) and type(p) is Shard and p.dim < len(shape) else Replicate()
                      for p in param.placements]
        return dtensor_zeros(shape, device_mesh=param.device_mesh, placements=placements, dtype=torch.float32)
    return torch.zeros(shape, dtype=torch.float32, device=param.device)
