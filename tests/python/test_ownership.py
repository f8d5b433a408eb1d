"""Weight-ownership mode on Gloo processes: same parameters as single-process DMuon (fp32,
1e-5 relative), with FSDP2 on the rest, plain DP, gradient accumulation and a 2×2 mesh;
Newton–Schulz overlapping backward; DCP checkpoints; bad inputs."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from dist_harness import run_distributed
from dist_workers import (TinyTransformer, _batches, _device, _loss, _single_process_dmuon, errors_against_reference,
                          train_beside_reference)
from test_checkpoint import snapshot
from worker_tensors import wholes


TOLERANCE = 1e-5


def _check(results: dict, world: int) -> None:
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        assert result["freed_again"], rank
    owners = {tuple(r["owners"]) for r in results.values()}
    assert len(owners) == 1  # every rank agrees on the plan
    if world > 1:
        assert len(set(next(iter(owners)))) > 1  # the work is spread


# (world, wrapper, mesh shape, micro-batches, reshard after forward, dtype): plain DP at
# worlds 1-4 (world 1: as plain DMuon), FSDP2 on the rest, a float64 model (each owner steps
# its matrices in float64, the other rank passes nothing of them, as single-process DMuon
# does), gradient accumulation (reduced once), weights kept between forward and backward,
# and a 2x2 mesh.
CASES = {f"dp-w{w}": (w, "dp", (), 1, True, torch.float32) for w in (1, 2, 3, 4)}
CASES.update({"fsdp2-w2": (2, "fsdp2", (), 1, True, torch.float32), "fsdp2-w4": (4, "fsdp2", (), 1, True, torch.float32),
              "float64": (2, "dp", (), 1, True, torch.float64), "accumulate": (2, "fsdp2", (), 2, True, torch.float32),
              "no-reshard": (2, "dp", (), 1, False, torch.float32), "mesh-2x2": (4, "dp", (2, 2), 1, True, torch.float32)})


@pytest.mark.parametrize("case", CASES)
def test_weight_ownership_matches_single_process(case):
    world, wrapper, mesh, micro, reshard, dtype = CASES[case]
    _check(run_distributed(ownership_matches_single_process, world, wrapper, mesh, micro, reshard,
                           3, dtype), world)


def test_newton_schulz_runs_while_backward_continues():
    results = run_distributed(orthogonalization_overlaps_backward, 2)
    for rank, t in results.items():
        # The last layer's bucket was orthogonalized completely before the first layer's
        # gradient existed, i.e. under backward.
        assert t["last_ns_begin"] < t["last_ns_end"] < t["first_grad"] < t["finish"], (rank, t)


@pytest.mark.parametrize("load_world", [1, 2, 4])
def test_checkpoint_resumes_through_dcp_at_any_world_size(tmp_path, load_world):
    """Saved at world 2 after 2 steps; a fresh run at world 1, 2 or 4 (another owner plan)
    loads it and takes the next 2 steps like the run that kept going: on every rank, the
    weights and the whole optimizer state, bitwise at the same world, within float rounding
    of the split batch (1e-5) elsewhere."""
    from test_checkpoint import assert_every_rank_matches

    path = str(tmp_path / "ckpt")
    saved = run_distributed(ownership_checkpoint_resumes, 2, path, "save")
    loaded = run_distributed(ownership_checkpoint_resumes, load_world, path, "load")
    assert_every_rank_matches(loaded, saved, 0.0 if load_world == 2 else 1e-5)


def test_a_save_outside_materialized_is_refused_on_every_rank_with_nothing_written(tmp_path):
    # Catches: DCP reading a non-owner's freed weight (it crashed the process), a rank that
    # refuses while another waits in the save's collectives, a half-written directory.
    results = run_distributed(ownership_save_outside_materialized, 2, str(tmp_path / "ckpt"))
    for rank, error in results.items():
        assert "holds no memory on this rank" in error and "owned.materialized(optimizer)" in error, (rank, error)
        assert "state['model']['" in error, (rank, error)
    assert not list(tmp_path.iterdir()), "a refused save wrote nothing"


# ------------------------------------------------------------------- NaN/Inf policy
@pytest.mark.parametrize("case", ["raise", "skip", "corrupt"])
def test_a_bad_value_on_one_rank_raises_or_skips_everywhere_and_changes_nothing(case):
    """One NaN on the last rank only (its gradient of layers.0.weight, or the owner's
    momentum buffer of layers.2.weight): every rank raises (naming the parameter and step)
    or skips, no weight or momentum buffer changes, and the Newton–Schulz of the later
    layers, already done under that backward, is discarded (after a skip, step 3 lands where
    a run without step 2's batch lands, bitwise)."""
    results = run_distributed(ownership_nonfinite, 3, case)
    for rank, r in results.items():
        assert r["ns_under_backward"], (rank, r)  # the work to discard existed
        assert r["unchanged"], (rank, r)
        if case == "raise":
            assert r["raised"] and "'layers.0.weight'" in r["raised"] and "step 2" in r["raised"], (rank, r)
            assert "nothing was updated" in r["raised"], (rank, r)
        elif case == "corrupt":
            assert r["raised"] and "momentum buffer of parameter 'layers.2.weight'" in r["raised"], (rank, r)
            assert "step 2" in r["raised"] and r["nan_buffers"] == ["layers.2.weight.momentum_buffer"], (rank, r)
        else:
            assert r["raised"] is None and r["counters"] == (3, 1), (rank, r)
            assert max(r["distance_to_clean_run"].values()) == 0.0, (rank, r["distance_to_clean_run"])


@pytest.mark.parametrize("failing_step", [1, 2])
def test_a_step_refused_on_one_rank_drops_its_window_everywhere_and_training_goes_on(failing_step):
    """One rank's failed check refuses the step on every rank (before the runtime is made,
    or in its start agreement); the owned gradients of that window go with it, so the next
    backward reduces afresh and the next steps train on every rank."""
    results = run_distributed(a_failed_check_then_training_goes_on, 2, failing_step)
    assert "lr" in results[1]["errors"][0], results[1]
    assert f"dmuon step {failing_step}: rank 1 failed its checks" in results[0]["errors"][0], results[0]
    for rank, result in results.items():
        assert len(result["errors"]) == 1 and result["steps"] == 2, (rank, result)


# ----------------------------------------------------------------------- bad inputs
def test_own_matrices_rejects_bad_arguments():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    with pytest.raises(ValueError, match="prefetch"):
        dmuon.own_matrices(model, prefetch=-1)
    with pytest.raises(ValueError, match="reduce_dtype"):
        dmuon.own_matrices(model, reduce_dtype=torch.int32)
    with pytest.raises(ValueError, match="planner"):
        dmuon.own_matrices(model, planner="magic")
    with pytest.raises(TypeError, match="model"):
        dmuon.own_matrices([1, 2])
    with pytest.raises(ValueError, match="no Muon matrix"):
        dmuon.own_matrices(nn.Sequential(nn.LayerNorm(4)))


def test_owned_matrix_in_an_adamw_group_is_rejected():
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 4, bias=False))
    dmuon.own_matrices(model, predicate=lambda name, p: True)
    with pytest.raises(ValueError, match="AdamW group"):
        dmuon.DMuon([{"params": list(model.parameters()), "use_muon": False}], lr=0.01)
    with pytest.raises(ValueError, match="already owned"):
        dmuon.own_matrices(model, predicate=lambda name, p: True)


def test_normuon_on_an_owned_matrix_is_refused_by_name():
    """The owned matrices' step begins inside backward, where NorMuon does not run: the first
    step() says so, naming the matrix."""
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False), nn.Linear(8, 4, bias=False))
    dmuon.own_matrices(model)
    opt = dmuon.DMuon(model, lr=0.01, normuon=True)
    model(torch.randn(2, 8)).sum().backward()
    with pytest.raises(ValueError, match="normuon=True for parameter '0.weight', which dmuon.own_matrices owns"):
        opt.step()


def test_each_layers_matrices_land_on_different_owners():
    """Layer spreading: with 4 same-shape matrices per layer and 4 ranks, no owner publishes
    two matrices of one layer (the plan's balance is unchanged: 2 matrices per rank)."""
    owners = run_distributed(owners_of_layers, 4)[0]
    for layer in owners:
        assert sorted(layer) == [0, 1, 2, 3], owners


@pytest.mark.gpu
@pytest.mark.parametrize("wrapper", ["dp", "fsdp2"])
def test_weight_ownership_on_one_gpu(wrapper):
    """One NCCL rank on one GPU: the side-stream worker, storage release and publish copies
    on CUDA, against single-process DMuon (update within 3e-2: float16 Newton–Schulz).
    NOTE: single-process DMuon takes the fused path (its norm summed in another order), so
    the two runs are independent fp16 iterations, each ~1-2.5% from the exact polar factor
    at these sizes; on the H200 they differed by 1.7% (qkv.weight)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    results = run_distributed(ownership_matches_single_process, 1, wrapper, backend="nccl")
    for name, error in results[0]["update_errors"].items():
        assert error < 3e-2, (name, error)
    assert results[0]["freed_again"]


def test_mismatched_owned_matrices_raise_on_every_rank():
    results = run_distributed(mismatched_owned_matrices, 2, timeout_s=60, collective_timeout_s=20)
    for rank, message in results.items():
        assert "differ across ranks" in message and "own_matrices" in message, (rank, message)


# ---------------------------------------------------------------- on the ranks
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
    Returns this rank's whole parameters and optimizer state (test_checkpoint.snapshot)."""

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


def ownership_save_outside_materialized(rank: int, world: int, path: str) -> str:
    """One step, then a save of the model's state dict outside owned.materialized(): the
    error this rank raises."""
    torch.manual_seed(0)
    model = TinyTransformer()
    dmuon.own_matrices(model, replicate_others=True)
    opt = dmuon.DMuon(model, lr=0.01)
    _loss(model, _batches(0, 1, 4)[2 * rank:2 * rank + 2]).backward()
    opt.step()
    try:
        dmuon.checkpoint.save({"model": model.state_dict()}, path)
    except dmuon.checkpoint.CheckpointError as error:
        return str(error)
    return "saved"


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
