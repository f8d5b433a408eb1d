"""Rank functions of the weight-ownership tests (run by dist_harness on Gloo processes)."""

from __future__ import annotations

import copy
import time

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from checkpoint_workers import snapshot
from worker_tensors import wholes
from dist_workers import (TinyTransformer, _batches, _device, _loss, _single_process_dmuon, errors_against_reference,
                          train_beside_reference)


def ownership_matches_single_process(rank: int, world: int, wrapper: str, mesh_shape: tuple = (),
                                     accumulate: int = 1, reshard: bool = True, num_steps: int = 3,
                                     dtype: torch.dtype = torch.float32) -> dict:
    """Weight-ownership training (owned matrices; the rest under FSDP2 or plain DP) against
    single-process DMuon on the whole batch. Returns per parameter the relative error."""
    torch.manual_seed(0)
    device = _device()
    reference = TinyTransformer().to(device=device, dtype=dtype)
    model = copy.deepcopy(reference)
    initial = wholes(reference)
    options = dict(lr=0.01, weight_decay=0.05)
    ref_opt = _single_process_dmuon(reference, **options)
    mesh = init_device_mesh(device.type, mesh_shape) if mesh_shape else None
    owned = dmuon.own_matrices(model, mesh, reshard_after_forward=reshard, bucket_size_mb=0.001,
                               replicate_others=(wrapper == "dp"))
    if wrapper == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        flat = init_device_mesh(device.type, (world,))
        for layer in (model.qkv, model.proj, model.up, model.down):
            fully_shard(layer, mesh=flat, ignored_params=owned.params)
        fully_shard(model, mesh=flat, ignored_params=owned.params)
    opt = dmuon.DMuon(model, **options)

    def backward(mine: torch.Tensor) -> None:
        for micro in range(accumulate):
            last = micro == accumulate - 1
            owned.set_requires_gradient_sync(last)
            if wrapper == "fsdp2":
                model.set_requires_gradient_sync(last)
            (_loss(model, mine[micro * 2:(micro + 1) * 2]) / accumulate).backward()

    train_beside_reference(rank, world, reference, ref_opt, opt, backward, num_steps, per_rank=2 * accumulate)
    with owned.materialized(opt):
        errors, update_errors = errors_against_reference(model, reference, initial)
    owners = [owned.owner_of(e.master) for e in owned._entries]
    # After leaving the block, non-owners hold no bytes of the owned weights again.
    freed = all(dmuon._C.ownership.storage_is_allocated(e.master) == (owners[e.index] == rank)
                for e in owned._entries)
    return {"errors": errors, "update_errors": update_errors, "owners": owners, "freed_again": freed}


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps (the layers below it get their gradients late) and,
    with `poison`, puts one NaN into the gradient it passes on."""

    @staticmethod
    def forward(ctx, x, seconds, poison):
        ctx.seconds, ctx.poison = seconds, poison
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        if ctx.poison:
            grad = grad.clone()
            grad.view(-1)[0] = float("nan")
        return grad, None, None


class _Deep(nn.Module):
    """Square layers whose first layer's gradient arrives `slow_s` late (so that the other
    buckets' Newton–Schulz runs under backward first) and, with `poison`, holds a NaN (the
    layers above stay finite)."""

    def __init__(self, width: int = 48, depth: int = 4, slow_s: float = 0.5):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))
        self.slow_s, self.poison = slow_s, False

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if i == 0:
                x = _SlowBackward.apply(x, self.slow_s, self.poison)
        return x


def _layer_times(owned) -> dict:
    """From the runtime's timeline: when layers.0.weight's gradient was ready, when the
    Newton–Schulz of layers.3.weight's bucket began and ended, and when the step finished."""
    events = owned.timeline()
    names = [e.name for e in owned._entries]
    first, last = names.index("layers.0.weight"), names.index("layers.3.weight")
    bucket_of = {i: k for k, bucket in enumerate(owned.exchange.buckets) for i in bucket}
    t = lambda what, index: next(e.seconds for e in events if e.what == what and e.index == index)  # noqa: E731
    return {"first_grad": t("grad_ready", first), "last_ns_begin": t("ns_begin", bucket_of[last]),
            "last_ns_end": t("ns_end", bucket_of[last]), "finish": next((e.seconds for e in events if e.what == "finish"), None)}


def orthogonalization_overlaps_backward(rank: int, world: int) -> dict:
    """Newton–Schulz of the last layer's bucket runs while the first layer's backward is
    still pending (its gradient is held back 0.5 s); times from the runtime's timeline."""
    torch.manual_seed(0)
    model = _Deep()
    owned = dmuon.own_matrices(model, bucket_size_mb=0.0001, replicate_others=True)
    opt = dmuon.DMuon(model, lr=0.01)
    for _ in range(2):
        owned.exchange.clear_timeline()
        opt.zero_grad()
        model(torch.randn(8, 48)).square().mean().backward()
        opt.step()
    return _layer_times(owned)


def ownership_checkpoint_resumes(rank: int, world: int, path: str, phase: str) -> dict:
    """DCP through materialized(): phase "save" trains 2 steps and saves, then trains 2
    more; phase "load" (world 1, 2 or 4: another plan) loads and trains the same 2 steps.
    Returns this rank's whole parameters and optimizer state (checkpoint_workers.snapshot)."""

    torch.manual_seed(0)
    model = TinyTransformer()
    owned = dmuon.own_matrices(model, replicate_others=True)
    opt = dmuon.DMuon(model, lr=0.01, weight_decay=0.05)

    # NOTE: one global batch of 4 sequences split over the ranks, so runs at different
    # world sizes see the same data.
    per_rank = 4 // world

    def train(steps):
        for step in steps:
            tokens = _batches(step, 1, 4)
            opt.zero_grad()
            _loss(model, tokens[rank * per_rank:(rank + 1) * per_rank]).backward()
            opt.step()

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if phase == "save":
        train(range(2))
        with owned.materialized(opt):
            model_state, optim_state = get_state_dict(model, opt)
            dmuon.checkpoint.save({"model": model_state, "optim": optim_state}, path)
    else:
        with owned.materialized(opt):
            model_state, optim_state = get_state_dict(model, opt)
            state = {"model": model_state, "optim": optim_state}
            dmuon.checkpoint.load(state, path)
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    train(range(2, 4))
    with owned.materialized(opt):
        return snapshot(model, opt)


class _Blocks(nn.Module):
    """Two decoder-like layers of four same-shape matrices each."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleDict({k: nn.Linear(width, width, bias=False) for k in ("q", "k", "v", "o")}) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["o"](torch.tanh(layer["q"](x) + layer["k"](x) * layer["v"](x)))
        return x


def owners_of_layers(rank: int, world: int) -> list[list[int]]:
    """Owners of each layer's matrices (the plan shared by every rank)."""
    model = _Blocks()
    owned = dmuon.own_matrices(model)
    return [[owned.owner_of(layer[k].weight) for k in ("q", "k", "v", "o")] for layer in model.layers]


def mismatched_owned_matrices(rank: int, world: int) -> str:
    """Rank 1 builds a wider model: own_matrices must raise on every rank, not hang."""
    model = nn.Sequential(nn.Linear(8, 8 if rank != 1 else 12, bias=False), nn.Linear(8 if rank != 1 else 12, 4, bias=False))
    try:
        dmuon.own_matrices(model, predicate=lambda name, p: True)
    except ValueError as error:
        return str(error)
    return "no error"


def a_failed_check_then_training_goes_on(rank: int, world: int, failing_step: int) -> dict:
    """Rank 1's options are bad at step `failing_step` only (1: the step that makes the
    runtime, 2: a later one): every rank raises, the owned gradients of that window are
    dropped on every rank, and the next steps train."""
    torch.manual_seed(0)
    model = _Deep(width=16, depth=3)
    dmuon.own_matrices(model, bucket_size_mb=0.0001, replicate_others=True)
    opt = dmuon.DMuon(model, lr=0.01)
    errors = []
    for step in range(1, 4):
        opt.zero_grad()
        model(torch.randn(4, 16, generator=torch.Generator().manual_seed(step))).square().mean().backward()
        if step == failing_step and rank == 1:
            opt.param_groups[0]["lr"] = -1.0
        try:
            opt.step()
        except RuntimeError as error:
            errors.append(str(error))
        opt.param_groups[0]["lr"] = 0.01
    return {"errors": errors, "steps": opt.param_groups[0]["num_steps"]}


def dead_rank_during_backward(rank: int, world: int) -> str:
    """Rank 1 exits after two steps; rank 0's third step fails naming the step and the
    collective within the collective timeout instead of hanging."""
    import os

    torch.manual_seed(0)
    model = _Deep(width=16, depth=3)
    dmuon.own_matrices(model, bucket_size_mb=0.0001, replicate_others=True)
    opt = dmuon.DMuon(model, lr=0.01)
    try:
        for step in range(3):
            if step == 2 and rank == 1:
                os._exit(0)
            opt.zero_grad()
            model(torch.randn(4, 16)).square().mean().backward()
            opt.step()
    except Exception as error:  # noqa: BLE001 - the message is the result
        return str(error)
    return "no error"


def _owned_snapshot(model: nn.Module, owned, opt) -> dict:
    """Every owned weight and its momentum buffer, whole (materialized on every rank)."""
    with owned.materialized(opt):
        out = {name: p.detach().clone() for name, p in model.named_parameters()}
        out.update({f"{name}.momentum_buffer": opt.state[p]["momentum_buffer"].detach().clone()
                    for name, p in model.named_parameters() if "momentum_buffer" in opt.state[p]})
    return out


def ownership_nonfinite(rank: int, world: int, case: str) -> dict:
    """Weight ownership, step 2 bad on the last rank only: case "raise" / "skip" (a NaN in
    that rank's gradient of layers.0.weight; nonfinite policy of the same name) or "corrupt"
    (a NaN in the owner's momentum buffer of layers.2.weight). Every rank must raise or skip,
    change no weight and no momentum buffer, and discard the Newton–Schulz work that began
    under that step's backward; after a skip, step 3 must land where a run that never saw
    step 2's batch lands."""

    def batch(step: int) -> torch.Tensor:
        return torch.randn(8, 32, generator=torch.Generator().manual_seed(100 * step + rank))

    def run(steps: list[int], bad_step: int | None) -> dict:
        torch.manual_seed(0)
        model = _Deep(width=32, slow_s=0.2)
        owned = dmuon.own_matrices(model, bucket_size_mb=0.0001, replicate_others=True)
        opt = dmuon.DMuon(model, lr=0.02, nonfinite="skip" if case == "skip" else "raise")
        out: dict = {}
        for step in steps:
            bad = step == bad_step
            if bad:
                if case == "corrupt" and owned.is_owner(model.layers[2].weight):
                    opt.state[model.layers[2].weight]["momentum_buffer"].view(-1)[0] = float("nan")
                out["before"] = _owned_snapshot(model, owned, opt)
                owned.exchange.clear_timeline()
            model.poison = bad and case != "corrupt" and rank == world - 1
            opt.zero_grad()
            model(batch(step)).square().mean().backward()
            try:
                opt.step()
            except dmuon.NonFiniteGradientError as error:
                out["raised"] = str(error)
            if bad:
                times = _layer_times(owned)
                out["ns_under_backward"] = times["last_ns_end"] < times["first_grad"]
                out["after"] = _owned_snapshot(model, owned, opt)
                if "raised" in out:
                    return out
        out["final"] = _owned_snapshot(model, owned, opt)
        out["counters"] = (opt.param_groups[0]["num_steps"], opt.param_groups[0]["num_skipped_steps"])
        return out

    result = run([1, 2, 3], bad_step=2)
    before, after = result["before"], result["after"]
    out = {"raised": result.get("raised"), "ns_under_backward": result["ns_under_backward"],
           "counters": result.get("counters"),
           "unchanged": before.keys() == after.keys() and all(_same(before[k], after[k]) for k in before),
           "nan_buffers": sorted(k for k, v in after.items() if torch.isnan(v).any())}
    if case == "skip":
        clean = run([1, 3], bad_step=None)
        out["distance_to_clean_run"] = {k: float((result["final"][k] - v).abs().max())
                                        for k, v in clean["final"].items()}
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN where NaN."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num())
