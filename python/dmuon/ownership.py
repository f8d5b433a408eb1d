"""Weight-ownership mode: each Muon matrix lives whole on one owner rank.

``owned = dmuon.own_matrices(model, mesh)`` (before ``fully_shard``; pass
``ignored_params=owned.params`` to it) plans an owner for every Muon matrix, keeps the
weight only on its owner, and hooks the model:

- forward: before a module runs, its owned weights are published (broadcast from the
  owner into a persistent compute tensor, prefetched ``prefetch`` modules ahead) and
  swapped in; after it, the module gets its master parameters back and, with
  ``reshard_after_forward``, the compute copies are freed (re-published before backward);
- backward: each gradient is added into a compact bucket buffer; complete buckets are
  reduced to their owners at once (two levels on a 2-D mesh), and, once a bucket's
  reduction has arrived (polled at each hook; on GPUs a side stream waits for it), the
  owner's momentum and Newton–Schulz of its matrices start in the early work of DMuon's
  step engine while backward continues;
- ``dmuon.DMuon.step`` waits for the rest and steps the owned matrices with every other
  Muon parameter in one engine step (one start agreement, one result agreement).

The scheduling, collectives and math are C++ (``dmuon._C.ownership.Exchange`` and the step
engine); this module adapts torch objects: modules, hooks, parameters and process groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten

from dmuon import distributed
from dmuon._ops import _C
from dmuon.config import Ownership, with_flat
from dmuon.params import MUON_DTYPES, dtype_name as _dtype_name
from dmuon.routing import route_module

_ATTR = "_dmuon_ownership"
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def layer_of_name(name: str) -> int:
    """The block index in a parameter name (``model.layers.3.mlp.up_proj.weight`` → 3), else -1."""
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else -1


@dataclass
class _Owned:
    """One owned matrix: where it is registered, its master and its compute tensor, and
    whether this rank owns it."""
    index: int
    name: str
    module: nn.Module
    attr: str
    master: nn.Parameter
    compute: nn.Parameter
    mine: bool


class _Groups:
    """Dedicated process groups of the exchange (its collectives never interleave with
    FSDP's): the mesh's rows (shard groups), two groups per column (publishes; the
    reduction's second level alone) and one over every rank (the plan, the step's
    agreements), with every rank's (replica, shard) coordinates."""

    def __init__(self, mesh: Any) -> None:
        self.shard = self.replicate = self.replicate_reduce = None
        self.world = None  # group over every rank of the mesh (None: one process)
        self.shards, self.replicas = 1, 1
        self.shard_of: list[int] = []
        self.replica_of: list[int] = []
        if mesh is None:
            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
                return
            mesh = dist.group.WORLD
        if isinstance(mesh, dist.ProcessGroup):
            rows = [sorted(dist.get_process_group_ranks(mesh))]
        else:
            from torch.distributed.device_mesh import DeviceMesh

            if not isinstance(mesh, DeviceMesh):
                raise TypeError(f"mesh must be None, a ProcessGroup or a DeviceMesh, got {type(mesh).__name__}")
            if mesh.ndim not in (1, 2):
                raise ValueError(f"mesh must be 1-D (shard) or 2-D (replicate × shard), got {mesh.ndim}-D")
            rows = [[int(r) for r in row] for row in mesh.mesh.reshape(-1, mesh.mesh.shape[-1]).tolist()]
        # NOTE: a group's ranks are its members in ascending order; a rank's coordinates are
        # its ranks in its row and column groups only where rows and columns ascend.
        columns = [list(c) for c in zip(*rows)]
        if any(line != sorted(line) for line in rows + columns):
            raise ValueError(f"mesh {rows}: its rows and columns must hold ascending ranks (as init_device_mesh "
                             "makes them)")
        if len(rows) == 1 and len(rows[0]) == 1:
            return
        me = dist.get_rank()
        # NOTE: new_group is collective over the default group: every rank creates every
        # subgroup, in one order, and keeps its own. Without a timeout it would wait 30
        # minutes (torch's default), not the default group's, for a rank that stalls.
        timeout = distributed.timeout_of(dist.group.WORLD)

        def new_group(ranks: list[int]) -> Any:
            return dist.new_group(ranks, timeout=timeout)

        for row in rows:
            group = new_group(row)
            if me in row:
                self.shard = group
        if len(rows) > 1:
            for column in columns:
                publish = new_group(column)
                reduce = new_group(column)
                if me in column:
                    self.replicate, self.replicate_reduce = publish, reduce
        # Every rank of the mesh (the plan, the step's agreements; the plain-DP averaging of
        # the other parameters).
        everyone = sorted(r for row in rows for r in row)
        self.world = new_group(everyone) if len(rows) > 1 else self.shard
        self.shards, self.replicas = len(rows[0]), len(rows)
        at = {r: (q, s) for q, row in enumerate(rows) for s, r in enumerate(row)}
        self.replica_of = [at[r][0] for r in everyone]
        self.shard_of = [at[r][1] for r in everyone]

    def groups(self) -> Any:
        """The C++ exchange's view of them (dmuon._C.ownership.Groups)."""
        def name(g: Any) -> str:
            return "" if g is None else g.group_name
        return _C.ownership.Groups(world=name(self.world), row=name(self.shard), column=name(self.replicate),
                                   column_reduce=name(self.replicate_reduce), shards=self.shards,
                                   replicas=self.replicas, shard_of=self.shard_of, replica_of=self.replica_of)


class OwnedMatrices:
    """The handle `own_matrices` returns: owned parameters, owners, gradient-sync control,
    materialization for checkpoints, and the exchange's timeline."""

    def __init__(self, entries: list[_Owned], exchange: Any, groups: _Groups, *,
                 reshard_after_forward: bool, prefetch: int, others: list[nn.Parameter]) -> None:
        self._entries = entries
        self.exchange = exchange
        self._groups = groups
        self._reshard = reshard_after_forward
        self._prefetch = prefetch
        self._sync = True
        self._optimizer = None
        self._others = others
        self._in_backward = False
        self._units: list[nn.Module] = []
        self._unit_params: dict[int, list[_Owned]] = {}
        self._order: list[int] = []          # unit ids in forward order (learned once)
        self._position: dict[int, int] = {}  # unit id → its index in _order
        self._order_frozen = False
        self._handles: list[Any] = []
        for entry in entries:
            key = id(entry.module)
            if key not in self._unit_params:
                self._units.append(entry.module)
                self._unit_params[key] = []
            self._unit_params[key].append(entry)
        self._install_hooks()

    # ---------------------------------------------------------------- public
    @property
    def params(self) -> set[nn.Parameter]:
        """The owned master parameters: pass them to ``fully_shard(..., ignored_params=...)``."""
        return {e.master for e in self._entries}

    @property
    def rank(self) -> int:
        return self.exchange.rank

    def owner_of(self, param: torch.Tensor) -> int:
        """The rank that owns `param`."""
        entry = self._entry_of(param)
        return self.exchange.owners[entry.index]

    def is_owner(self, param: torch.Tensor) -> bool:
        return self._entry_of(param).mine

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """False for gradient-accumulation micro-batches: gradients accumulate in the bucket
        buffers and are reduced once, in the next backward with sync (or at step)."""
        self._sync = bool(requires_gradient_sync)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        previous = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = previous

    def timeline(self) -> list[Any]:
        """The events of the current (or last) step: grad_ready (parameter index),
        reduce_issued, ns_begin and ns_end (bucket index; the owner's early work on the
        bucket's matrices), flush (the end of backward), finish (the step's start); each
        with seconds on one clock."""
        return list(self.exchange.timeline())

    @contextlib.contextmanager
    def materialized(self, optimizer: Any = None) -> Iterator[None]:
        """Every rank holds every owned weight (and, with `optimizer`, its momentum buffer)
        inside the block: for state_dict / DCP save and load, which then work as for
        replicated parameters. On exit non-owners free them again; what was loaded on the
        owner is kept."""
        self._release_all()
        entries = self._entries
        for e in entries:
            self.exchange.materialize(e.index, e.master)
        if optimizer is not None:
            # NOTE: every state entry exists inside the block (zeros on a fresh optimizer),
            # so a checkpoint loads into the full structure on every rank.
            optimizer.init_state()
            for e in entries:
                state = optimizer.state[e.master]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(e.master, memory_format=torch.contiguous_format)
                    _C.ownership.free_storage(state["momentum_buffer"])
                self.exchange.materialize(e.index, state["momentum_buffer"])
        try:
            yield
        finally:
            for e in entries:
                if not e.mine:
                    _C.ownership.free_storage(e.master)
                    if optimizer is not None:
                        optimizer.state.pop(e.master, None)

    # ------------------------------------------------------------- internals
    def _entry_of(self, param: torch.Tensor) -> _Owned:
        for e in self._entries:
            if e.master is param:
                return e
        raise KeyError("this parameter is not owned by this OwnedMatrices")

    def _attach(self, optimizer: Any) -> None:
        if self._optimizer is not None and self._optimizer is not optimizer:
            raise RuntimeError("these owned matrices already belong to another DMuon optimizer")
        self._optimizer = optimizer

    def _publish(self, entries: list[_Owned]) -> None:
        for e in entries:
            self.exchange.publish(e.index, e.compute, e.master)

    def _prefetch_units(self, unit_key: int, direction: int) -> None:
        pos = self._position.get(unit_key) if self._order_frozen else None
        if pos is None or self._prefetch <= 0:
            return
        for step in range(1, self._prefetch + 1):
            nxt = pos + direction * step
            if 0 <= nxt < len(self._order):
                self._publish(self._unit_params[self._order[nxt]])

    def _swap_in(self, module: nn.Module) -> None:
        for e in self._unit_params[id(module)]:
            module._parameters[e.attr] = e.compute

    def _swap_out(self, module: nn.Module) -> None:
        for e in self._unit_params[id(module)]:
            module._parameters[e.attr] = e.master

    def _release(self, entries: list[_Owned]) -> None:
        for e in entries:
            self.exchange.release(e.index, e.compute)

    def _release_all(self) -> None:
        self._release(self._entries)

    def _install_hooks(self) -> None:
        for module in self._units:
            self._handles.append(module.register_forward_pre_hook(self._pre_forward))
            self._handles.append(module.register_forward_hook(self._post_forward))
        for e in self._entries:
            if e.compute.requires_grad:
                self._handles.append(e.compute.register_post_accumulate_grad_hook(self._make_grad_hook(e)))

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        key = id(module)
        if not self._order_frozen and key not in self._position:
            self._position[key] = len(self._order)
            self._order.append(key)
        entries = self._unit_params[key]
        self._publish(entries)
        self._prefetch_units(key, +1)
        for e in entries:
            self.exchange.wait_published(e.index)
        self._swap_in(module)

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> Any:
        self._swap_out(module)
        entries = self._unit_params[id(module)]
        tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if torch.is_grad_enabled() and tensors:
            torch.autograd.graph.register_multi_grad_hook(
                tensors, lambda grads, module=module: self._pre_backward(module), mode="any")
        if self._reshard or not (torch.is_grad_enabled() and tensors):
            self._release(entries)
        return output

    def _pre_backward(self, module: nn.Module) -> None:
        self._order_frozen = True
        key = id(module)
        entries = self._unit_params[key]
        self._publish(entries)
        self._prefetch_units(key, -1)
        for e in entries:
            self.exchange.wait_published(e.index)

    def _make_grad_hook(self, entry: _Owned) -> Callable[[torch.Tensor], None]:
        def hook(compute: torch.Tensor) -> None:
            self._order_frozen = True
            if not self._in_backward:
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            grad = compute.grad
            compute.grad = None
            # NOTE: with its runtime made, the optimizer begins its step here (the owner's
            # momentum buffer goes with the gradient): finished buckets start their matrices'
            # Newton–Schulz inside backward.
            opt = self._optimizer
            momentum = opt._backward.owned_ready(entry) if opt is not None and self._sync else None
            self.exchange.grad_ready(entry.index, grad, momentum, self._sync)
            self.exchange.release(entry.index, compute)
        return hook

    def _end_of_backward(self) -> None:
        self._in_backward = False
        self.exchange.end_backward(self._sync)
        if self._sync and self._others:
            _average_gradients(self._others, self._groups.world, self.exchange.step_idx)

    def _after_step(self) -> None:
        """Compute copies are stale once the owners have stepped."""
        self._release_all()


def _average_gradients(params: list[nn.Parameter], group: Any, step_idx: int) -> None:
    """Plain data parallel for the parameters nobody owns: one coalesced all_reduce; its
    failure names it and step `step_idx`, as the exchange's collectives do."""
    if group is None:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    try:
        dist.all_reduce(flat, group=group)
    except Exception as error:
        raise RuntimeError(f"dmuon: all_reduce of the unowned parameters' gradients (step {step_idx}) failed on rank "
                           f"{dist.get_rank(group)} of {dist.get_world_size(group)}: {error}") from error
    flat /= dist.get_world_size(group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def own_matrices(model: nn.Module, mesh: Any = None,
                 predicate: Callable[[str, nn.Parameter], bool] | None = None, *,
                 options: Ownership | None = None, **flat: Any) -> OwnedMatrices:
    """Give every Muon matrix of `model` one owner rank (weight-ownership mode).

    Call after the model is on its device and before ``fully_shard`` (pass
    ``ignored_params=owned.params``). ``mesh``: None (the default group, or one process),
    a ProcessGroup, a 1-D DeviceMesh, or a 2-D (replicate × shard) DeviceMesh whose
    reduction runs inside shard groups first. ``predicate(name, param)``: which matrices
    to own (default: DMuon's routing: ndim ≥ 2, not embeddings or the output head).
    ``reshard_after_forward``: free non-owned weights after each module's forward and
    publish them again for backward (False keeps them until their gradient is reduced).
    ``prefetch``: modules published ahead. ``param_dtype``: dtype of the compute copies
    (e.g. torch.bfloat16 under FSDP2 mixed precision). ``reduce_dtype``: dtype of gradient
    buckets and of their reduction. ``replicate_others``: plain data parallel for every
    other parameter (without FSDP2/DDP): their gradients are averaged at the end of each
    synchronizing backward and rank 0's values are broadcast now. These are the fields of
    ``options`` (a :class:`dmuon.Ownership`), or flat keywords of the same names.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    fields = {f.name for f in dataclasses.fields(Ownership)}
    unknown = sorted(set(flat) - fields)
    if unknown:
        raise TypeError(f"own_matrices got unexpected keyword argument(s) {unknown}; options: {sorted(fields)}")
    options = with_flat(Ownership, options, "options", flat)
    reshard_after_forward, prefetch, bucket_size_mb = options.reshard_after_forward, options.prefetch, \
        options.bucket_size_mb
    reduce_dtype, param_dtype, planner = options.reduce_dtype, options.param_dtype, options.planner
    spread_layers, replicate_others = options.spread_layers, options.replicate_others

    # Which matrices, where they are registered.
    # NOTE: frozen matrices are not owned (no gradient to reduce); DMuon keeps them as plain
    # Muon parameters, which train once unfrozen.
    routed = [r for r in route_module(model, predicate) if r.use_muon and r.param.requires_grad]
    if not routed:
        raise ValueError("own_matrices found no Muon matrix in the model")
    registered = {}
    for module_name, module in model.named_modules():
        for attr, param in module._parameters.items():
            if param is not None:
                registered.setdefault(id(param), (module, attr))
    for r in routed:
        if getattr(r.param, _ATTR, None) is not None:
            raise ValueError(f"parameter {r.name!r} is already owned (own_matrices was called twice)")
        if isinstance(r.param, DTensor):
            raise TypeError(f"parameter {r.name!r} is already a DTensor; call own_matrices before fully_shard")
        if not isinstance(r.param, nn.Parameter):
            raise TypeError(f"parameter {r.name!r} is a {type(r.param).__name__}, not an nn.Parameter")
        if not r.param.is_contiguous():
            raise ValueError(f"parameter {r.name!r} is not contiguous")

    groups = _Groups(mesh)
    # NOTE: every rank must own the same matrices; a mismatch raises here on every rank
    # (one all_gather_object) instead of hanging in the first publish.
    from dmuon.distributed import check_same_parameters_on_all_ranks

    check_same_parameters_on_all_ranks(
        groups.world, [("own_matrices", r.name, tuple(r.param.shape), str(r.param.dtype)) for r in routed])
    device = routed[0].param.device
    device_type = "cuda" if device.type == "cuda" else "cpu"
    layouts = [_C.dist.ParamLayout(list(r.param.shape), r.batch_dims, False, row_blocks=list(r.row_blocks),
                                   transposed=r.transposed) for r in routed]
    names = [r.name for r in routed]
    options = _C.ownership.Options(bucket_bytes=int(bucket_size_mb * 2**20), reduce_dtype=_dtype_name(reduce_dtype),
                                   solver=planner, device_type=device_type, spread_layers=spread_layers)
    for r in routed:
        if r.param.dtype not in MUON_DTYPES:
            raise TypeError(f"parameter {r.name!r}: dtype {r.param.dtype} cannot be owned; "
                            f"use one of {list(MUON_DTYPES)}")
    # NOTE: the owners are planned here, by the step engine's planner (collective).
    exchange = _C.ownership.Exchange(groups.groups(), names, layouts, [layer_of_name(n) for n in names],
                                     [_dtype_name(r.param.dtype) for r in routed], options)

    # Compute tensors; non-owners drop the master's bytes.
    owners = exchange.owners
    entries = []
    for index, r in enumerate(routed):
        module, attr = registered[id(r.param)]
        compute = nn.Parameter(torch.empty(r.param.shape, dtype=param_dtype or r.param.dtype, device=r.param.device),
                               requires_grad=r.param.requires_grad)
        _C.ownership.free_storage(compute)
        entry = _Owned(index, r.name, module, attr, r.param, compute, owners[index] == exchange.rank)
        entries.append(entry)
        if not entry.mine:
            _C.ownership.free_storage(r.param)
    owned_ids = {id(r.param) for r in routed}
    others = [p for p in model.parameters() if id(p) not in owned_ids and p.requires_grad]
    if replicate_others and groups.world is not None:
        with torch.no_grad():
            for p in others:
                dist.broadcast(p, src=dist.get_global_rank(groups.world, 0), group=groups.world)
    handle = OwnedMatrices(entries, exchange, groups, reshard_after_forward=reshard_after_forward,
                           prefetch=prefetch, others=others if replicate_others else [])
    for e in entries:
        setattr(e.master, _ATTR, handle)
    return handle


def ownership_of(param: torch.Tensor) -> OwnedMatrices | None:
    """The OwnedMatrices that owns `param`, if any."""
    return getattr(param, _ATTR, None)


def find_ownership(optimizer: Any) -> OwnedMatrices | None:
    """The OwnedMatrices of `optimizer`'s owned parameters (at most one), checked complete
    and attached to it."""
    handles = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            handle = ownership_of(p)
            if handle is not None:
                if not group["use_muon"]:
                    raise ValueError(f"parameter {optimizer.param_name(p)!r} is owned (dmuon.own_matrices) "
                                     "but sits in an AdamW group; owned matrices must use Muon")
                handles[id(handle)] = handle
    if len(handles) > 1:
        raise ValueError("DMuon's parameters come from several own_matrices calls; use one per model")
    if not handles:
        return None
    handle = next(iter(handles.values()))
    mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [e.name for e in handle._entries if id(e.master) not in mine]
    if missing:
        raise ValueError(f"every owned matrix must be in this optimizer, but {missing[:3]} are not")
    handle._attach(optimizer)
    return handle
