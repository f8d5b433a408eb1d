"""Adapts torch's distributed objects for the C++ runtime: where each Muon parameter's rows
live (DTensor placements, DDP replicas), which process group carries the exchange, and
the construction-time check that every rank holds the same parameters.

Supported layouts of a Muon parameter:
- a DTensor with ``Shard(0)`` on one mesh dimension and ``Replicate()`` on the others
  (FSDP2, HSDP's 2-D mesh): sharded over that dimension's group;
- a DTensor that is ``Replicate()`` on a 1-D mesh: replicated over the mesh's group;
- a plain tensor while a process group is given or the default one is initialized with
  more than one rank (DDP): replicated over that group;
- a plain tensor without distribution: single process.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard


@dataclasses.dataclass(frozen=True, kw_only=True)
class Placement:
    """Where one parameter's rows live."""

    global_shape: tuple[int, ...]
    sharded: bool
    group: Any  # a ProcessGroup, or None for one process


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's tensor (the local shard of a DTensor)."""
    if isinstance(t, DTensor):
        return t.to_local()
    return t


def placement_of(name: str, param: torch.Tensor, process_group: Any) -> Placement:
    """How `param` is distributed; errors name the parameter and its placements."""
    if isinstance(param, DTensor):
        placements = tuple(param.placements)
        mesh = param.device_mesh
        shard_dims = [i for i, p in enumerate(placements) if isinstance(p, Shard)]
        others_replicated = all(isinstance(p, (Shard, Replicate)) for p in placements)
        if len(shard_dims) == 1 and placements[shard_dims[0]].dim == 0 and others_replicated:
            return Placement(global_shape=tuple(param.shape), sharded=True, group=mesh.get_group(shard_dims[0]))
        if not shard_dims and others_replicated and mesh.ndim == 1:
            return Placement(global_shape=tuple(param.shape), sharded=False, group=mesh.get_group(0))
        raise ValueError(f"Muon parameter {name!r} is a DTensor with placements {placements} on a "
                         f"{mesh.ndim}-D mesh; DMuon supports Shard(0) on one mesh dimension (other "
                         "dimensions Replicate) or Replicate on a 1-D mesh")
    if process_group is not None:
        return Placement(global_shape=tuple(param.shape), sharded=False, group=process_group)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return Placement(global_shape=tuple(param.shape), sharded=False, group=dist.group.WORLD)
    return Placement(global_shape=tuple(param.shape), sharded=False, group=None)


def common_group(names: list[str], placements: list[Placement]) -> Any:
    """The one process group every Muon parameter uses (None: one process)."""
    groups = {id(p.group): p.group for p in placements}
    if len(groups) > 1:
        by_group = {}
        for name, p in zip(names, placements):
            by_group.setdefault(id(p.group), name)
        raise ValueError("all Muon parameters must live on one process group, but e.g. "
                         f"{list(by_group.values())} use different groups")
    return next(iter(groups.values())) if groups else None


def group_name(group: Any) -> str:
    """The registered name the C++ runtime resolves the group by ("" for one process)."""
    if group is None or dist.get_world_size(group) == 1:
        return ""
    return group.group_name


def transport(group: Any) -> str:
    """How dmuon's runtime treats `group` (its C++ detection, dmuon._C.dist.transport_of):
    "single" (one process), "real" or "fake" (torch's fake backend: this process plays one
    rank of the world, and the others behave like it)."""
    from dmuon._ops import _C

    return _C.dist.transport_of(group_name(group))


def check_same_parameters_on_all_ranks(group: Any, signature: list[tuple]) -> None:
    """Raise on every rank, naming the first differing entry, unless all ranks passed the
    same signature. NOTE: one all_gather_object of small lists, at construction only; a
    mismatch found here would otherwise hang in the first collective of a step.
    Over the fake backend there are no other ranks to compare with: by its model every rank
    holds this rank's parameters, so there is nothing to check (its all_gather would only
    copy this rank's signature D times)."""
    if group is None or dist.get_world_size(group) == 1 or transport(group) == "fake":
        return
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, signature, group=group)
    reference = gathered[0]
    for rank, other in enumerate(gathered):
        if other == reference:
            continue
        for idx in range(max(len(reference), len(other))):
            mine = reference[idx] if idx < len(reference) else None
            theirs = other[idx] if idx < len(other) else None
            if mine != theirs:
                raise ValueError(
                    f"DMuon's parameters differ across ranks: entry {idx} is {mine!r} on rank 0 but "
                    f"{theirs!r} on rank {rank} (every rank must construct DMuon with the same "
                    "parameters, in the same order, with the same options)")
