"""Adapts torch's distributed objects for the C++ runtime: where each Muon parameter's
pieces live (DTensor placements, DDP replicas), which process group carries the exchange,
and the construction-time check that every rank holds the same parameters.

Layouts of a Muon parameter:
- a DTensor on a 1-D mesh, ``Shard(0)`` (FSDP2) or ``Replicate()``: sharded or replicated
  over the mesh's group (the row layout);
- any other DTensor (a mesh of several dims: FSDP2 × TP, HSDP, HSDP × TP, EP × FSDP; or
  DTensors on different meshes in one optimizer): placed on its mesh with ``Shard(d)``,
  FSDP2's ``_StridedShard`` and ``Replicate()`` on any mesh dims (the mesh layout, C++
  ``dmuon/layout/placement.h``); every parameter's ranks must lie in one group, the union
  (the default group, a mesh's group that spans them all, or ``process_group=``), which
  carries the exchange; ``Partial`` and other placements are refused, naming the
  parameter and its placements;
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
    """Where one parameter's pieces live."""

    global_shape: tuple[int, ...]
    sharded: bool
    group: Any  # a ProcessGroup, or None for one process
    # The mesh layout (None: the row layout above): the mesh's shape, per mesh dim
    # (kind, tensor dim, split factor), and per rank of `group` its mesh coordinates
    # ([] where it holds none of the parameter).
    mesh_shape: tuple[int, ...] = ()
    mesh_placements: tuple[tuple[str, int, int], ...] = ()
    rank_coords: tuple[tuple[int, ...], ...] = ()

    @property
    def on_mesh(self) -> bool:
        return bool(self.mesh_shape)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshView:
    """One rank's view of a DTensor's placement: its mesh, placements and coordinates."""

    mesh_shape: tuple[int, ...]
    placements: tuple[tuple[str, int, int], ...]
    ranks: tuple[int, ...]   # global ranks of the mesh, row-major
    coords: tuple[int, ...]  # this rank's coordinates in it


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's tensor (the local shard of a DTensor)."""
    if isinstance(t, DTensor):
        return t.to_local()
    return t


def same_layout(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether `b` lies over the ranks as `a` does: both DTensors of one mesh, placements
    and shape (so their local tensors hold the same elements), or both plain tensors."""
    if isinstance(a, DTensor) != isinstance(b, DTensor):
        return False
    if not isinstance(a, DTensor):
        return True
    # NOTE: the mesh object first: FSDP2 gives a module's tensors one mesh, and comparing
    # two meshes compares their rank lists.
    same_mesh = a.device_mesh is b.device_mesh or a.device_mesh == b.device_mesh
    return same_mesh and a.placements == b.placements and a.shape == b.shape


def mesh_view(name: str, param: DTensor) -> MeshView:
    """This rank's view of `param`'s mesh placement; a placement DMuon cannot serve
    (``Partial``, …) raises naming the parameter and its placements."""
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = param.device_mesh
    kinds = []
    for p in param.placements:
        if isinstance(p, _StridedShard):
            kinds.append(("strided_shard", p.dim % param.ndim, int(p.split_factor)))
        elif isinstance(p, Shard):
            kinds.append(("shard", p.dim % param.ndim, 1))
        elif isinstance(p, Replicate):
            kinds.append(("replicate", 0, 1))
        else:
            raise ValueError(f"Muon parameter {name!r} is a DTensor with placements {tuple(param.placements)} on a "
                             f"{mesh.ndim}-D mesh; DMuon serves Shard(d), FSDP2's _StridedShard and Replicate() on "
                             f"any mesh dims, not {p!r} (e.g. a Partial parameter must be reduced first)")
    coords = mesh.get_coordinate()
    return MeshView(mesh_shape=tuple(mesh.shape), placements=tuple(kinds),
                    ranks=tuple(int(r) for r in mesh.mesh.flatten().tolist()),
                    coords=tuple(coords) if coords is not None else ())


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
        mesh_view(name, param)  # NOTE: raises for a placement DMuon cannot serve at all
        raise ValueError(f"Muon parameter {name!r} is a DTensor with placements {placements} on a "
                         f"{mesh.ndim}-D mesh: it needs the mesh layout (placements_of)")
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


def _row_layout_serves(params: list[torch.Tensor]) -> bool:
    """Whether the row layout serves every parameter: DTensors only on one 1-D mesh, with
    Shard(0) or Replicate()."""
    meshes = set()
    for p in params:
        if not isinstance(p, DTensor):
            continue
        if p.device_mesh.ndim != 1 or not all(
                type(pl) is Replicate or (type(pl) is Shard and pl.dim == 0) for pl in p.placements):
            return False
        meshes.add(tuple(p.device_mesh.mesh.flatten().tolist()))
    return len(meshes) <= 1


def _union_group(names: list[str], params: list[torch.Tensor], views: list[MeshView | None],
                 process_group: Any) -> Any:
    """The group that spans every parameter's ranks: process_group when given, else the
    default group when they span the world, else the group of a mesh that spans them all
    (flattened when it has several dims)."""
    union = set()
    for v in views:
        if v is not None:
            union.update(v.ranks)
    plain = [n for n, p in zip(names, params) if not isinstance(p, DTensor)]
    if process_group is not None:
        members = set(dist.get_process_group_ranks(process_group))
        missing = sorted(union - members)
        if missing:
            raise ValueError(f"process_group holds ranks {sorted(members)}, but the Muon parameters' meshes also "
                             f"span ranks {missing}; pass a group that holds every rank of every parameter's mesh")
        return process_group
    world = set(range(dist.get_world_size()))
    if union == world or plain:
        if plain and union != world:
            raise ValueError(f"Muon parameter {plain[0]!r} is a plain tensor (a replica on the default group) while "
                             f"DTensor parameters span only ranks {sorted(union)}; pass process_group= (the group "
                             "that spans them all)")
        return dist.group.WORLD
    for p in params:
        if isinstance(p, DTensor) and set(p.device_mesh.mesh.flatten().tolist()) == union:
            mesh = p.device_mesh
            return mesh.get_group(0) if mesh.ndim == 1 else mesh._flatten().get_group(0)
    raise ValueError(f"the Muon parameters' meshes span ranks {sorted(union)}, which no single mesh of theirs "
                     "holds; pass process_group= (a group holding every rank of every parameter's mesh)")


def placements_of(names: list[str], params: list[torch.Tensor], process_group: Any) -> tuple[list[Placement], Any]:
    """Every Muon parameter's placement and the one group that carries the exchange (None:
    one process). Collective over that group when the mesh layout is used (one
    all_gather_object of every rank's coordinates: meshes may be sub-meshes that differ
    between ranks, e.g. an EP group's)."""
    if _row_layout_serves(params):
        placements = [placement_of(name, p, process_group) for name, p in zip(names, params)]
        return placements, common_group(names, placements)
    views = [mesh_view(name, p) if isinstance(p, DTensor) else None for name, p in zip(names, params)]
    group = _union_group(names, params, views, process_group)
    size = dist.get_world_size(group)
    if transport(group) == "fake":
        # NOTE: no other rank to ask: by the fake world's model every rank sees this rank's meshes.
        gathered = []
        for t in range(size):
            g = dist.get_global_rank(group, t)
            gathered.append([None if v is None else
                             (v.mesh_shape, v.placements, _coords_in(v, g)) for v in views])
    else:
        mine = [None if v is None else (v.mesh_shape, v.placements, v.coords) for v in views]
        gathered = [None] * size
        dist.all_gather_object(gathered, mine, group=group)
    placements = []
    for idx, (name, p) in enumerate(zip(names, params)):
        if views[idx] is None:
            placements.append(Placement(global_shape=tuple(p.shape), sharded=False, group=group))
            continue
        coords = []
        for t, theirs in enumerate(gathered):
            entry = theirs[idx]
            if entry is None or entry[0] != views[idx].mesh_shape or entry[1] != views[idx].placements:
                raise ValueError(f"Muon parameter {name!r} is placed {views[idx].placements} on a "
                                 f"{views[idx].mesh_shape} mesh on this rank but "
                                 f"{None if entry is None else (entry[1], entry[0])} on rank {t} of DMuon's group")
            coords.append(tuple(entry[2]))
        placements.append(Placement(global_shape=tuple(p.shape), sharded=any(k != "replicate" for k, _, _ in
                                                                             views[idx].placements),
                                    group=group, mesh_shape=views[idx].mesh_shape,
                                    mesh_placements=views[idx].placements, rank_coords=tuple(coords)))
    return placements, group


def _coords_in(view: MeshView, global_rank: int) -> tuple[int, ...]:
    """The coordinates of `global_rank` in the mesh of `view` (() when it is not in it)."""
    if global_rank not in view.ranks:
        return ()
    flat, coords = view.ranks.index(global_rank), []
    for size in reversed(view.mesh_shape):
        coords.append(flat % size)
        flat //= size
    return tuple(reversed(coords))


def group_name(group: Any) -> str:
    """The registered name the C++ runtime resolves the group by ("" for one process)."""
    if group is None or dist.get_world_size(group) == 1:
        return ""
    return group.group_name


def timeout_of(group: Any) -> Any:
    """The timeout of `group`'s collectives (init_process_group's, for the default group);
    None where its backend does not say."""
    for device in getattr(group, "_device_types", ()):
        options = getattr(group._get_backend(device), "options", None)
        if options is not None and hasattr(options, "_timeout"):
            return options._timeout
    return None


def same_ranks_group(group: Any) -> Any:
    """A new process group of `group`'s ranks, its backend and timeout, made by those ranks
    only (each calls it once, at the same point)."""
    return dist.new_group(dist.get_process_group_ranks(group), backend=dist.get_backend(group),
                          timeout=timeout_of(group), use_local_synchronization=True)


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
