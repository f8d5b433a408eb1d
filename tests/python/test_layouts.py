"""Every DTensor layout composed with FSDP2 and HSDP gives the update of the
pure-PyTorch float64 reference (dmuon.reference) on the same gradients, on Gloo CPU
processes (the rank functions below): FSDP2 × TP 2×2, HSDP × TP 2×1×2, EP × FSDP
(a 4-expert MoE) beside dense FSDP2 weights in one DMuon, a 5-expert stack under FSDP2 at
world 3 planned expert by expert, two pipeline stages with a
DMuon each, a DCP checkpoint saved on a 2×2 mesh and resumed on a 1-D world of 2; and a
Partial parameter refused by name."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import dmuon
from dist_harness import run_distributed
from dmuon import distributed as dmuon_distributed
from dmuon import runtime_builder
from dmuon.reference import ReferenceDMuon
from worker_tensors import default_reference_groups, update_errors, whole, wholes

# NOTE: the float32 CPU Newton–Schulz against the float64 reference: every case here erred
# at most 4.7e-6 of the update's norm (measured on the 2-core development machine), 2x
# inside 1e-5; a wrong block, owner, replica or lr is off by O(1).
TOLERANCE = 1e-5


def _check(results: dict, world: int) -> None:
    assert sorted(results) == list(range(world))
    for rank, result in results.items():
        assert result["runtime"] == "EngineRuntime", (rank, result["runtime"])
        for name, ok in result["boxes"].items():
            assert ok, (rank, name, "the local tensor is not the box the layout gives this rank")
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)


@pytest.mark.parametrize("case", ["fsdp2_tp", "hsdp_tp", "ep_fsdp"])
def test_layout_gives_the_reference_update(case):
    results = run_distributed(layout_matches_reference, 4, case)
    _check(results, 4)
    for rank, result in results.items():
        # One transport over the whole mesh (the union of the groups for EP beside FSDP).
        assert result["world"] == 4, (rank, result["world"])
    # Replicas compute nothing twice: each matrix once over the world (the Block's 6, plus
    # 4 experts).
    expected = {"fsdp2_tp": 6, "hsdp_tp": 6, "ep_fsdp": 10}[case]
    assert sum(r["orthogonalized"] for r in results.values()) == expected


def test_fsdp2_expert_stack_split_over_three_ranks():
    # 5 experts under FSDP2's Shard(0) at world 3 (2, 2, 1 per rank, an uneven
    # split) beside a dense block: every expert planned as its own matrix, each once.
    results = run_distributed(layout_matches_reference, 3, "fsdp2_experts")
    _check(results, 3)
    assert sum(r["orthogonalized"] for r in results.values()) == 6 + 5
    assert len({tuple(r["owners"]) for r in results.values()}) == 1  # one plan on every rank


def test_partial_placement_is_refused_naming_the_parameter():
    results = run_distributed(partial_is_refused, 2)
    for rank, message in results.items():
        assert "'weight'" in message and "Partial" in message, (rank, message)


def test_gradient_placed_unlike_its_parameter_is_refused():
    results = run_distributed(misplaced_gradient_is_refused, 2)
    for rank, result in results.items():
        assert "'0.weight'" in result["error"] and "Shard(dim=1)" in result["error"], (rank, result["error"])
        assert result["unchanged"], rank


@pytest.mark.slow
def test_pipeline_stages_step_independently():
    results = run_distributed(pipeline_stages, 4)
    _check(results, 4)
    for rank, result in results.items():
        stage = result["stage"]
        # Each stage's DMuon runs over its own two ranks, never the world.
        assert result["group_ranks"] == [2 * stage, 2 * stage + 1], (rank, result["group_ranks"])
        assert result["world"] == 2


@pytest.mark.slow
def test_dcp_checkpoint_resumes_on_another_mesh(tmp_path):
    path = str(tmp_path / "ckpt")
    run_distributed(checkpoint_save, 4, path, 2)
    results = run_distributed(checkpoint_resume, 2, path, 2, 1)
    _check(results, 2)


# ---------------------------------------------------------------- on the ranks
# Gradients are set, not computed: every step's full gradient of every parameter is drawn
# from a seed all ranks share, fed to the reference as is and to DMuon as a DTensor with
# the parameter's own placements (a Replicate DTensor redistributed by torch, so torch, not
# dmuon, decides which rank holds which piece).

OPTIONS = dict(lr=0.02, weight_decay=0.1, ns_algorithm="gram", bucket_size_mb=0.0005)


class Block(nn.Module):
    """A Llama-style block's projections (no attention math: only the shapes and the
    parallel styles matter here): q, k colwise, o rowwise, gate/up colwise, down rowwise."""

    def __init__(self, hidden: int = 6, kv: int = 4, inter: int = 9) -> None:
        super().__init__()
        self.q = nn.Linear(hidden, hidden + 3, bias=True)  # 9 rows: uneven under TP 2 × FSDP 2
        self.k = nn.Linear(hidden, kv, bias=False)
        self.o = nn.Linear(hidden + 3, hidden, bias=False)  # columns split by TP, rows by FSDP
        self.gate = nn.Linear(hidden, inter, bias=False)
        self.up = nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)


class Experts(nn.Module):
    """A 4-expert MoE's expert weights, one [E, out, in] stack."""

    def __init__(self, num_experts: int = 4, out: int = 5, inp: int = 6) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(num_experts, out, inp) / inp ** 0.5)


TP_PLAN = {"q": "colwise", "k": "colwise", "o": "rowwise", "gate": "colwise", "up": "colwise", "down": "rowwise"}


def _tp(block: nn.Module, tp_mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(block, tp_mesh, {name: styles[kind]() for name, kind in TP_PLAN.items()})


def _is_muon(name: str, p: torch.Tensor) -> bool:
    return p.ndim >= 2


def _reference_groups(model: nn.Module) -> list[dict]:
    named = list(model.named_parameters())
    return default_reference_groups([p for n, p in named if _is_muon(n, p)],
                                    [p for n, p in named if not _is_muon(n, p)], OPTIONS)


def _like(p: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """`full` laid out as `p` is (torch's redistribution picks each rank's piece)."""
    if not isinstance(p, DTensor):
        return full.clone()
    mesh = p.device_mesh
    return distribute_tensor(full, mesh, [Replicate()] * mesh.ndim).redistribute(mesh, p.placements)


def _gradients(names: list[str], shapes: list[torch.Size], step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return {n: torch.randn(*s, generator=gen) / max(1, s[-1]) ** 0.5 for n, s in zip(names, shapes)}


def _steps(model: nn.Module | None, opt: Any, reference: nn.Module, ref_opt: Any, first: int, count: int) -> None:
    """Steps first, first + 1, ... of the reference and (unless None) of the model."""
    names = [n for n, _ in reference.named_parameters()]
    shapes = [p.shape for _, p in reference.named_parameters()]
    for step in range(first, first + count):
        grads = _gradients(names, shapes, step)
        for n, q in reference.named_parameters():
            q.grad = grads[n].clone()
        ref_opt.step()
        for n, p in (model.named_parameters() if model is not None else []):
            p.grad = _like(p, grads[n])
        if model is not None:
            opt.step()


def _boxes_hold_locals(opt: Any) -> dict[str, bool]:
    """Per Muon parameter: whether this rank's local tensor is the box of the full tensor the
    C++ layout gives it (the layout against torch's own placement of the pieces)."""
    placements, group = runtime_builder.placements(opt)
    rank = dist.get_rank(group) if group is not None else 0
    world = dist.get_world_size(group) if group is not None else 1
    out = {}
    for (_, p), placement in zip(opt._muon_params(), placements):
        layout = runtime_builder.layout(opt, p, placement)
        box = layout.rank_boxes(world, opt.param_name(p))[rank]
        full = whole(p)
        index = tuple(slice(b, b + c) for b, c in box)
        local = dmuon_distributed.local(p)
        out[opt.param_name(p)] = bool(local.shape == full[index].shape and torch.equal(local, full[index]))
    return out


def _result(model, opt, reference, initial) -> dict:
    return {"errors": update_errors(model, initial, reference, initial), "boxes": _boxes_hold_locals(opt),
            "runtime": type(opt.runtime).__name__, "world": opt.runtime.world_size,
            "orthogonalized": int(opt.runtime.last_stats.num_orthogonalized), "owners": list(opt.runtime.owners)}


def _dense_case(case: str):
    """The model, its reference copy and the meshes of `case` ("fsdp2_tp" 2×2, "hsdp_tp"
    2×1×2)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = Block()
    model = copy.deepcopy(reference)
    if case == "fsdp2_tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("layouts_dp", "layouts_tp"))
        _tp(model, mesh["layouts_tp"])
        fully_shard(model, mesh=mesh["layouts_dp"])
    elif case == "hsdp_tp":
        mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("layouts_rep", "layouts_shard", "layouts_tp2"))
        _tp(model, mesh["layouts_tp2"])
        fully_shard(model, mesh=mesh["layouts_rep", "layouts_shard"])
    else:
        raise ValueError(case)
    return model, reference


def layout_matches_reference(rank: int, world: int, case: str, num_steps: int = 2) -> dict:
    """`num_steps` DMuon steps of the `case` model against ReferenceDMuon; per parameter the
    error of DMuon's total update relative to the reference's, and the layout check."""
    if case == "ep_fsdp":
        model, reference = _ep_case()
    elif case == "fsdp2_experts":
        model, reference = _fsdp2_experts_case()
    else:
        model, reference = _dense_case(case)
    initial = wholes(reference)
    ref_opt = ReferenceDMuon(_reference_groups(reference))
    opt = dmuon.DMuon(model, muon_filter=_is_muon, **OPTIONS)
    _steps(model, opt, reference, ref_opt, 0, num_steps)
    return _result(model, opt, reference, initial)


class MoeModel(nn.Module):
    def __init__(self, num_experts: int = 4) -> None:
        super().__init__()
        self.dense = Block()
        self.experts = Experts(num_experts)


def _fsdp2_experts_case():
    """One FSDP2 over a 1-D world (3 ranks) on a dense block and a 5-expert stack:
    Shard(0) on the expert dim cuts it as torch.chunk does (2, 2, 1 experts), so every expert
    is whole on one rank, its home; the planner plans the experts one by one with the dense
    weights, and keeps or moves each."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = MoeModel(num_experts=5)
    model = copy.deepcopy(reference)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("layouts_experts",))
    fully_shard(model, mesh=mesh)
    return model, reference


def _ep_case():
    """Dense weights FSDP2 over the world (1-D mesh of 4); experts EP over 2 (Shard(0) of
    the stack) and FSDP2 over the other 2: a 2-D (dp, ep) mesh, each expert whole on one rank."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = MoeModel()
    model = copy.deepcopy(reference)
    world_mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("layouts_world",))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("layouts_edp", "layouts_ep"))
    model.experts.w = nn.Parameter(distribute_tensor(model.experts.w.detach(), mesh["layouts_ep"], [Shard(0)]))
    fully_shard(model.experts, mesh=mesh["layouts_edp"])
    fully_shard(model.dense, mesh=world_mesh)
    return model, reference


def partial_is_refused(rank: int, world: int) -> str:
    """A Partial DTensor Muon parameter: DMuon's error (every rank raises alike)."""
    from torch.distributed.tensor import Partial

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("layouts_partial",))
    layer = nn.Linear(4, 3, bias=False)
    layer.weight = nn.Parameter(DTensor.from_local(torch.randn(3, 4), mesh, [Partial()]))
    try:
        dmuon.DMuon(layer, muon_filter=_is_muon, **OPTIONS)
    except ValueError as error:
        return str(error)
    return ""


def misplaced_gradient_is_refused(rank: int, world: int) -> dict:
    """A colwise (Shard(0)) TP weight given a Shard(1) gradient: the step is refused on
    every rank, naming the parameter, with nothing written."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("layouts_misplaced",))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4, bias=False))
    parallelize_module(model, mesh, {"0": ColwiseParallel()})
    opt = dmuon.DMuon(model, muon_filter=_is_muon, **OPTIONS)
    weight = model[0].weight
    before = whole(weight)
    weight.grad = distribute_tensor(torch.ones(4, 4), mesh, [Shard(1)])
    try:
        opt.step()
    except RuntimeError as error:
        return {"error": str(error), "unchanged": bool(torch.equal(whole(weight), before))}
    return {"error": "", "unchanged": False}


# ---------------------------------------------------------------- pipeline parallelism
def _stage(stage: int) -> nn.Module:
    """Stage 0: two projections; stage 1: three of other shapes (stages differ)."""
    torch.manual_seed(10 + stage)
    if stage == 0:
        return nn.Sequential(nn.Linear(6, 8, bias=False), nn.Linear(8, 7, bias=True))
    return nn.Sequential(nn.Linear(7, 10, bias=False), nn.Linear(10, 7, bias=False), nn.Linear(7, 5, bias=False))


def pipeline_stages(rank: int, world: int, num_steps: int = 2) -> dict:
    """world 4 = 2 stages × 2 ranks: stage 0 FSDP2 over its 2 ranks, stage 1 TP over its 2
    (colwise, rowwise, colwise): one DMuon per stage over that stage's group, stepping
    independently (stage 1 steps one more time)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("layouts_pp", "layouts_stage"))
    stage = mesh.get_coordinate()[0]
    reference = _stage(stage)
    model = copy.deepcopy(reference)
    sub = mesh["layouts_stage"]
    if stage == 0:
        for layer in model:
            fully_shard(layer, mesh=sub)
    else:
        parallelize_module(model, sub, {"0": ColwiseParallel(), "1": RowwiseParallel(), "2": ColwiseParallel()})
    initial = wholes(reference)
    ref_opt = ReferenceDMuon(_reference_groups(reference))
    opt = dmuon.DMuon(model, muon_filter=_is_muon, **OPTIONS)
    _steps(model, opt, reference, ref_opt, 0, num_steps + stage)
    out = _result(model, opt, reference, initial)
    out["stage"] = stage
    out["group_ranks"] = dist.get_process_group_ranks(opt._group)
    return out


# ---------------------------------------------------------------- DCP
def checkpoint_save(rank: int, world: int, path: str, num_steps: int) -> dict:
    """FSDP2 × TP on 2×2: `num_steps` steps, then model and optimizer saved through DCP."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, reference = _dense_case("fsdp2_tp")
    ref_opt = ReferenceDMuon(_reference_groups(reference))
    opt = dmuon.DMuon(model, muon_filter=_is_muon, **OPTIONS)
    _steps(model, opt, reference, ref_opt, 0, num_steps)
    model_sd, optim_sd = get_state_dict(model, opt)
    dmuon.checkpoint.save({"model": model_sd, "optim": optim_sd}, path)
    return {"saved": True}


def checkpoint_resume(rank: int, world: int, path: str, num_saved: int, num_more: int) -> dict:
    """The checkpoint of checkpoint_save loaded into FSDP2 on a 1-D world of 2, then
    `num_more` steps: against the reference run straight through."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = Block()
    initial = wholes(reference)
    model = Block()  # NOTE: other values than the saved ones (seed 0 draws differ after the reference's)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("layouts_resume",))
    fully_shard(model, mesh=mesh)
    ref_opt = ReferenceDMuon(_reference_groups(reference))
    opt = dmuon.DMuon(model, muon_filter=_is_muon, **OPTIONS)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dmuon.checkpoint.load(state, path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    # The reference's first num_saved steps, then both go on.
    _steps(None, None, reference, ref_opt, 0, num_saved)
    _steps(model, opt, reference, ref_opt, num_saved, num_more)
    return _result(model, opt, reference, initial)
