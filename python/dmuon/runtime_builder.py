"""The C++ step runtime of a DMuon (``dmuon._C.engine.EngineRuntime``) and what it is made
from: the Muon parameters' placements (DTensor, replicas, one process) and layouts, each
Muon group's typed rule (``GroupRule``, its Newton–Schulz schedule built once), the typed
``RuntimeOptions``; and the checks made with the placements at construction (every rank
holds the same parameters, replicas are equal)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from dmuon import distributed, rank_agreement
from dmuon._ops import _C
from dmuon.group_options import MATH_DEFAULTS, group_signature_options
from dmuon.params import dtype_name
from dmuon.split_options import split_key


# ------------------------------------------------------------------ the groups' rules
def _schedule_key(group: dict[str, Any]) -> tuple:
    """What a Muon group's Newton–Schulz schedule is built from (a checked group)."""
    coefficients, restarts = group["ns_coefficients"], group.get("ns_restarts")
    return (group["ns_algorithm"], group["ns_steps"],
            None if coefficients is None else tuple(tuple(float(x) for x in c) for c in coefficients),
            None if restarts is None else tuple(restarts), float(group["eps"]))


def _build_schedule(key: tuple) -> Any:
    """The C++ schedule (dmuon._C.NsSchedule) of a _schedule_key: the algorithm's default
    coefficients and restarts, each replaced where the group sets it."""
    algorithm, steps, coefficients, restarts, eps = key
    return _C.ns_schedule(algorithm, steps, None if coefficients is None else list(coefficients),
                          None if restarts is None else list(restarts), eps)


def group_schedule(opt: Any, g_idx: int, group: dict[str, Any]) -> Any:
    """The NsSchedule of Muon group `g_idx`, built when the group was added; built again
    only when its ns_* keys or eps changed since (set by the user, or a checkpoint loaded):
    the step hands the built C++ object over, nothing is parsed per step."""
    key = _schedule_key(group)
    entry = opt._schedules.get(g_idx)
    if entry is None or entry[0] != key:
        entry = opt._schedules[g_idx] = (key, _build_schedule(key))
    return entry[1]


def group_rules(opt: Any) -> tuple[list[Any], dict[int, int]]:
    """The typed rule (dmuon._C.engine.GroupRule) of every Muon group, and each Muon group's
    slot among them."""
    rules, slot = [], {}
    for g_idx, group in enumerate(opt.param_groups):
        if group["use_muon"]:
            slot[g_idx] = len(rules)
            rules.append(_C.engine.GroupRule(
                lr=float(group["lr"]), weight_decay=float(group["weight_decay"]),
                momentum=float(group["momentum"]), nesterov=bool(group["nesterov"]),
                adjust_lr=group["adjust_lr"] or "none", schedule=group_schedule(opt, g_idx, group),
                # NorMuon's options (a group saved before they existed has none: their defaults).
                **{key: type(default)(group.get(key, default)) for key, default in MATH_DEFAULTS.items()}))
    return rules, slot


# ------------------------------------------------------------------- placements
def placements(opt: Any) -> tuple[list[distributed.Placement], Any]:
    """Each Muon parameter's placement (in opt._muon_params() order) and their process group."""
    muon = opt._muon_params()
    names = [opt.param_name(p) for _, p in muon]
    if opt._process_group == rank_agreement.LOCAL:
        # Every rank trains its own model: no group, whatever is initialized.
        for name, (_, p) in zip(names, muon):
            if isinstance(p, DTensor):
                raise ValueError(f"process_group={rank_agreement.LOCAL!r}, but parameter {name!r} is a DTensor "
                                 "(its mesh shares it across ranks)")
        return [distributed.Placement(global_shape=tuple(p.shape), sharded=False, group=None)
                for _, p in muon], None
    # NOTE: the mesh layout gathers every rank's mesh coordinates (a collective): made
    # once per set of Muon parameters.
    key = tuple(id(p) for _, p in muon)
    if opt._placement_cache is None or opt._placement_cache[0] != key:
        found, group = distributed.placements_of(names, [p for _, p in muon], opt._process_group)
        opt._placement_cache = (key, found, group)
    return list(opt._placement_cache[1]), opt._placement_cache[2]


def check_replicas(opt: Any) -> None:
    """The parameters treated as replicas (not sharded, on a multi-rank group) must be equal
    on every rank: one all_reduce of checksums, an error naming the first that is not."""
    found, group = placements(opt)
    opt._group = group
    replicas = [(opt.param_name(p), distributed.local(p)) for (_, p), pl in zip(opt._muon_params(), found)
                if not pl.sharded and pl.group is not None and not pl.on_mesh]
    rank_agreement.check_replicas_equal(group, [n for n, _ in replicas], [t for _, t in replicas])


def check_ranks_agree(opt: Any) -> None:
    """Every rank must hold the same parameters with the same options (else: error on all)."""
    _, group = placements(opt)
    signature = []
    for g_idx, group_options in enumerate(opt.param_groups):
        signature.append(("group", g_idx, group_signature_options(group_options)))
        for p in group_options["params"]:
            placement = getattr(p, "placements", None)
            signature.append((opt.param_name(p), tuple(p.shape), str(p.dtype), repr(placement)))
    distributed.check_same_parameters_on_all_ranks(group, signature)


def layout(opt: Any, param: torch.Tensor, placement: distributed.Placement) -> Any:
    """The C++ runtime's view of one Muon parameter: shape, matrices (row or column
    blocks of a split), sharding."""
    view = opt.matrix_view(param)
    if view.col_blocks > 1 and placement.on_mesh:
        # NOTE: the ItemTable cuts column blocks out of any box (a TP rank's columns
        # too), but only Shard(0) rows and replicas are tested end to end.
        raise ValueError(f"split_heads={view.col_blocks}, split_dim=1 for parameter {opt.param_name(param)!r}: it "
                         f"is placed on a {len(placement.mesh_shape)}-D mesh {placement.mesh_placements}; column "
                         "blocks take a parameter sharded on dim 0 (FSDP2) or replicated")
    mesh = {}
    if placement.on_mesh:
        mesh = dict(mesh_shape=list(placement.mesh_shape), placements=list(placement.mesh_placements),
                    rank_coords=[list(c) for c in placement.rank_coords])
    return _C.dist.ParamLayout(list(placement.global_shape), view.batch_dims, placement.sharded,
                               row_blocks=list(view.row_blocks), transposed=view.transposed,
                               col_blocks=view.col_blocks, **mesh)


def _owned_world(opt: Any, group: Any) -> Any:
    """The engine's group with owned matrices: the ownership mesh's world group, which
    the Muon parameters not owned must span too (or none: one process)."""
    world = opt._ownership._groups.world
    if group is not None and (world is None or sorted(dist.get_process_group_ranks(group))
                              != sorted(dist.get_process_group_ranks(world))):
        raise ValueError("the Muon parameters that dmuon.own_matrices does not own live on other ranks than its "
                         "mesh; own every matrix, or give own_matrices the mesh of the others")
    return world


def _device_type(opt: Any, muon: list, owned: list) -> str:
    """"cuda" or "cpu": the one device of every Muon parameter (one runtime drives one
    device: its collectives, flags and fused batches); ValueError naming two that differ."""
    devices = {}
    for p in [distributed.local(p) for _, p in muon] + owned:
        devices.setdefault(p.device, opt.param_name(p))
    if len(devices) > 1:
        (first, a), (second, b) = list(devices.items())[:2]
        raise ValueError(f"DMuon needs every Muon parameter on one device: {a!r} is on {first}, {b!r} on {second}")
    return "cuda" if next(iter(devices), torch.device("cpu")).type == "cuda" else "cpu"


def _backward_step_on(opt: Any, handle: Any) -> bool:
    """Whether the step begins inside backward (Execution.backward_step); ValueError where it
    was asked for and cannot, or where the owned matrices meet NorMuon."""
    # NOTE: None: off (measured default, docs/configuration.md: on the fake ranks of
    # worlds 8 and 64, and on 2 Gloo CPU processes, no run has shown forward + backward
    # within 2% of the step after backward with less left after it).
    wanted = opt.execution.backward_step
    # NOTE: NorMuon's row state is made at step(): the step of such groups cannot begin
    # inside backward (column blocks can: they are pieces of the tensors).
    unable = [f"param_groups[{g_idx}] (normuon=True)" for g_idx, g in enumerate(opt.param_groups)
              if g["use_muon"] and g.get("normuon")]
    if wanted and unable:
        raise ValueError(f"Execution.backward_step=True cannot start the step inside backward for "
                         f"{unable[0]}; set backward_step=None or False")
    # NOTE: the owned matrices' step always begins inside backward, where NorMuon's pass
    # does not run yet.
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    owned_normuon = [e.name for e in (handle._entries if handle is not None else [])
                     if group_of[id(e.master)].get("normuon")]
    if owned_normuon:
        raise ValueError(f"normuon=True for parameter {owned_normuon[0]!r}, which dmuon.own_matrices owns: the "
                         "weight-ownership mode does not apply NorMuon; leave it out of own_matrices or of the "
                         "normuon group")
    return bool(wanted) and bool(opt._backward.attached) and handle is None and not unable


def _engine_group(opt: Any, group: Any) -> Any:
    """The runtime's process group: `group`, or, where the step begins inside backward on
    several ranks, a group of the same ranks of its own (made once per optimizer and ranks)."""
    # NOTE: the early stages' collectives are issued from the runtime's worker thread while
    # backward issues FSDP2's or DDP's from its own: on one group, two ranks could see them in
    # different orders (NCCL and Gloo match collectives by their order).
    if not opt._backward_step_on or group is None or dist.get_world_size(group) == 1:
        return group
    ranks = tuple(dist.get_process_group_ranks(group))
    if ranks not in opt._engine_groups:
        opt._engine_groups[ranks] = distributed.same_ranks_group(group)
    return opt._engine_groups[ranks]


def ensure_runtime(opt: Any, checks: Any = None) -> Any:
    """opt's step runtime for the current Muon parameters (built collectively); built again
    when a group's split changed (the user or a loaded checkpoint set it). Before it is
    built, the ranks agree on `checks` (this step's, else made here) in the same collective
    as a step's start agreement, so that a rank that builds it alone (its param groups
    changed) meets the others' step and every rank raises."""
    if opt._runtime is not None and opt._runtime_split != split_key(opt.param_groups):
        opt._runtime = None
    if opt._runtime is not None:
        return opt._runtime
    muon = opt._muon_params()
    handle = opt._ownership
    owned = [e.master for e in handle._entries] if handle is not None else []
    device_type = _device_type(opt, muon, owned)
    found, group = placements(opt)
    if handle is not None:
        group = _owned_world(opt, group)
    _C.engine.agree_start(distributed.group_name(group), device_type,
                          checks if checks is not None else opt._step_checks(), opt.param_groups[0]["num_steps"] + 1)
    opt._runtime_split = split_key(opt.param_groups)
    layouts = [layout(opt, p, pl) for (_, p), pl in zip(muon, found)]
    opt._backward_step_on = _backward_step_on(opt, handle)
    # NOTE: the engine times each Muon group's NS batches itself when it plans
    # (cost_model "profile"; rank 0 times them and shares them: step/cost_profile.h).
    rules, slot = group_rules(opt)
    options = _C.engine.RuntimeOptions(
        device_type=device_type, backward_order=opt._backward_step_on, cost_schedules=[r.schedule for r in rules],
        backward_groups=opt._backward.backward_groups() if opt._backward_step_on else [], **opt._runtime_options)
    group_of = {id(p): g_idx for g_idx, g in enumerate(opt.param_groups) for p in g["params"]}
    opt._runtime = _C.engine.EngineRuntime(
        distributed.group_name(_engine_group(opt, group)), [opt.param_name(p) for _, p in muon], layouts,
        [dtype_name(p.dtype) for _, p in muon], [slot[g_idx] for g_idx, _ in muon], options,
        owned=handle.exchange if handle is not None else None,
        owned_group_slot=[slot[group_of[id(p)]] for p in owned])
    note = opt._runtime.backward_stage_note
    if note and (group is None or dist.get_rank(group) == 0):
        warnings.warn(f"Execution.backward_step=True: {note}", UserWarning, stacklevel=4)
    return opt._runtime
