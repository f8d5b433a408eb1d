"""The sharded step begun inside backward (Execution.backward_step, dmuon.backward_step) on
Gloo CPU processes: the update equals the post-backward step's within 1e-6 of its norm in
FSDP2 (world 2), HSDP (2×2), DDP (world 2) and with 3 accumulated micro-batches (only the
last synced); stages left during backward from the second step on (the first builds the
runtime after backward); a NaN in the last layer's gradient (the first backward hands
over) raises on every rank with nothing written (the rank functions below)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from all_modes_workers import OPTIONS, SHAPES, ProbeModel, _targets, wrap
from dist_harness import run_distributed
from dist_workers import _device
from worker_tensors import update_errors, whole, wholes


# NOTE: the same plan and per-matrix math on the CPU ops; only the stages' composition
# differs (backward order), which changes no matrix's arithmetic: held to 1e-6.
TOLERANCE = 1e-6

CASES = [("fsdp2", 2, 1), ("hsdp", 4, 1), ("ddp", 2, 1), ("fsdp2", 2, 3), ("ddp", 2, 3)]


@pytest.mark.parametrize("mode,world,micro", CASES, ids=[f"{m}-w{w}-micro{k}" for m, w, k in CASES])
def test_backward_step_matches_the_post_backward_step(mode, world, micro):
    results = run_distributed(backward_matches_post_backward, world, mode, micro)
    assert sorted(results) == list(range(world))
    for rank, result in results.items():
        assert result["backward_on"] and not result["off"], (rank, result)
        assert result["attached"] == ["ddp" if mode == "ddp" else "fsdp2"], result
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (mode, rank, name, error)
        # (early stages, stages, early NS matrices, NS matrices) per step. The first step
        # runs after backward (the runtime is made at step(); step() hands nothing over).
        assert result["early"][0][0] == 0, result["early"]
        for early_stages, stages, _, _ in result["early"][1:]:
            assert 0 < early_stages <= stages, result["early"]
        assert not any(result["stale"]), result["stale"]


@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("mode", ["fsdp2", "ddp"])
def test_nan_in_a_late_layer_raises_on_every_rank_and_writes_nothing(mode, poison):
    # The begun step is kept (not redone at step()), so the check that refuses it is the
    # one of the work begun inside backward. Catches: that check removed (the begun update
    # would be applied), or a NaN gradient taken as changed (a comparison of values, where
    # NaN ≠ NaN: then every such step is redone and the check is never reached).
    results = run_distributed(nan_in_late_layer, 2, mode, poison)
    for rank, result in results.items():
        assert result["early_open"], (rank, result)
        assert result["redone"] == [False], (rank, result)
        assert "non-finite gradient" in result["error"] and "layers.3.weight" in result["error"], (rank, result)
        assert result["unchanged"], (rank, result)


@pytest.mark.parametrize("change", ["clip", "replace"])
def test_gradients_changed_after_backward_are_stepped_as_changed(change):
    # NOTE: clip_grad_norm_ scales FSDP2's DTensor gradients in place without moving their
    # version counters; a gradient replaced is another tensor. step() sees their bits changed
    # (the engine compares what it read with what step() is given) and redoes the step.
    results = run_distributed(backward_matches_post_backward, 2, "fsdp2", 1, change)
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        # Every step but the first (run after backward) found its begun work stale.
        assert result["stale"] == [False] + [True] * (len(result["stale"]) - 1), (rank, result["stale"])


def test_stage_spread_plan_matches_the_post_backward_step():
    # Six same-shape layers at world 2, an FSDP2 unit per pair: the planner gives rank 0 the
    # first three and rank 1 the last three; begun from backward, each backward window (a
    # unit) is spread over both ranks (same counts per rank), so owners differ while every
    # update stays the post-backward step's within 1e-6.
    results = run_distributed(spread_plan_matches_post_backward, 2)
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        on, off = result["owners"][True], result["owners"][False]
        assert on != off, result["owners"]
        assert sorted(on) == sorted(off), result["owners"]  # same matrices per rank
        assert off[:6] == [0, 0, 0, 1, 1, 1], off
        assert all(on[k] != on[k + 1] for k in (0, 2, 4)), on
        for early_stages, stages in result["early"][1:]:
            assert 0 < early_stages <= stages and stages > 1, result["early"]


@pytest.mark.parametrize("clip", [False, True], ids=["no-clip", "clip"])
def test_default_options_start_most_of_an_8_block_models_ns_inside_backward(clip):
    # NOTE: the stages are the FSDP2 groups (one per block), not 64 MiB of wire: at the
    # default bucket size the whole model used to be one stage (0 of 24 NS matrices per
    # rank inside backward). From the second step on (the first makes the runtime after
    # backward) at least half of every rank's NS runs before backward ends; a clip that
    # scales the gradients makes step() drop the begun work and redo it all, exactly.
    results = run_distributed(default_blocks_match_post_backward, 2, clip)
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        assert result["stages"] == 8 and result["warnings"] == [], (rank, result)
        assert result["shares"][0] == 0, result["shares"]
        for share in result["shares"][1:]:
            assert share == 0 if clip else share >= 0.5, (rank, result["shares"])


def test_one_fsdp2_unit_for_the_whole_model_is_warned_about_once():
    results = run_distributed(default_blocks_match_post_backward, 2, False, "root")
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        assert result["stages"] == 1 and all(share == 0 for share in result["shares"]), result
        # NOTE: rank 0 warns; the message names the option and what to set.
        if rank == 0:
            assert len(result["warnings"]) == 1, result["warnings"]
            assert "holds 48 of 48 matrices" in result["warnings"][0]
            assert "fully_shard to each block" in result["warnings"][0]
            assert "backward_step=False" in result["warnings"][0]
        else:
            assert result["warnings"] == []


def test_the_engine_works_off_backwards_thread_on_a_group_of_its_own():
    # NOTE: the hooks only queue their hand-overs; the engine's calls (its
    # "dmuon.backward_step.engine" ranges, recorded through the hook's profiler state) run on
    # the runtime's worker thread, and its collectives on a process group of the mesh's ranks
    # that is not the mesh's (FSDP2 issues its own there from backward's thread).
    results = run_distributed(engine_threads_and_group, 2)
    for rank, result in results.items():
        hooks, engine = result["hook_threads"], result["engine_threads"]
        assert hooks and engine and not hooks & engine, (rank, result)
        assert result["engine_group_ranks"] == [0, 1] and not result["same_group"], (rank, result)
        assert result["early_stages"] > 0, (rank, result)


# ---------------------------------------------------------------- on the ranks
# The step begun inside backward (Execution.backward_step=True) against the post-backward
# step (False) of the same model, plan and gradients, in FSDP2, HSDP and DDP, with and without
# gradient accumulation; and a NaN in a late layer's gradient. On Gloo CPU processes (here)
# and over NCCL, one GPU per rank (dist_workers.nccl_scenarios, test_multigpu).


NUM_STEPS = 3


def _backward(wrapped: nn.Module, mode: str, step: int, micro: int, poison: float | None = None) -> None:
    """`micro` micro-batches (gradients summed; only the last one synced); `poison`: a value
    put into the last layer's target of the last one."""
    for k in range(micro):
        last = k == micro - 1
        targets = [(t * (1.0 + 0.25 * k)).to(_device()) for t in _targets(10 * step + k)]
        if poison is not None and last:
            targets[-1][0, 0] = poison
        if mode == "ddp" and not last:
            with wrapped.no_sync():
                wrapped(targets).backward()
            continue
        if mode != "ddp":
            wrapped.set_requires_gradient_sync(last)
        wrapped(targets).backward()


def backward_matches_post_backward(rank: int, world: int, mode: str, micro: int, change: str = "") -> dict:
    """NUM_STEPS steps with backward_step on and off; per weight, ‖Δon − Δoff‖ / ‖Δoff‖,
    and the begun step's statistics of the last step. `change` after backward: "clip"
    (clip_grad_norm_, in place) or "replace" (each gradient another tensor, halved)."""
    torch.manual_seed(0)
    base = ProbeModel()
    models = {on: copy.deepcopy(base) for on in (True, False)}
    initial = {on: wholes(m) for on, m in models.items()}
    wrapped = {on: wrap(m, mode, world) for on, m in models.items()}
    opts = {}
    for on, m in models.items():
        opts[on] = dmuon.DMuon(m, execution=dmuon.Execution(backward_step=on, **{
            k: v for k, v in OPTIONS.items() if k == "bucket_size_mb"}),
            **{k: v for k, v in OPTIONS.items() if k != "bucket_size_mb"})
        if mode == "ddp":
            opts[on].attach_backward_step(wrapped[on])
    early, stale = [], []
    for step in range(NUM_STEPS):
        for on in (True, False):
            opts[on].zero_grad()
            _backward(wrapped[on], mode, step, micro)
            if change == "clip":  # NOTE: scales the gradients in place after they were handed over
                torch.nn.utils.clip_grad_norm_(models[on].parameters(), 0.05)
            if change == "replace":
                for p in models[on].parameters():
                    p.grad = p.grad * 0.5
            opts[on].step()
        stats = opts[True].runtime.last_stats
        early.append((stats.early_stages, stats.num_buckets, stats.early_orthogonalized, stats.num_orthogonalized))
        stale.append(stats.begun_stale)
    errors = update_errors(models[True], initial[True], models[False], initial[False])
    return dict(errors=errors, early=early, stale=stale, backward_on=opts[True]._backward_step_on,
                attached=list(opts[True]._backward.attached), off=opts[False]._backward_step_on)


def nan_in_late_layer(rank: int, world: int, mode: str, poison: float = float("nan")) -> dict:
    """A step, then one whose last layer's gradient holds `poison` (NaN or Inf): the error on
    this rank, whether anything changed, and whether step() redid the begun step."""
    torch.manual_seed(0)
    model = ProbeModel()
    wrapped = wrap(model, mode, world)
    opt = dmuon.DMuon(model, execution=dmuon.Execution(backward_step=True, bucket_size_mb=OPTIONS["bucket_size_mb"]),
                      lr=OPTIONS["lr"], weight_decay=OPTIONS["weight_decay"], ns_algorithm="gram")
    if mode == "ddp":
        opt.attach_backward_step(wrapped)
    opt.zero_grad()
    _backward(wrapped, mode, 0, 1)
    opt.step()
    before = [whole(p) for p in model.parameters()]
    buffers = [opt.state[p]["momentum_buffer"] for p in model.parameters() if "momentum_buffer" in opt.state[p]]
    buffers_before = [whole(b) for b in buffers]
    opt.zero_grad()
    _backward(wrapped, mode, 1, 1, poison=poison)
    early_open = opt.runtime.step_open
    error = ""
    try:
        opt.step()
    except dmuon.NonFiniteGradientError as e:
        error = str(e)
    # Whether step() found the begun work stale (then it is dropped and the step redone
    # from the gradients, and the begun step's own check is never what refuses it).
    redone = [opt.runtime.last_stats.begun_stale]
    unchanged = all(torch.equal(a, whole(p)) for a, p in zip(before, model.parameters()))
    unchanged = unchanged and all(torch.equal(a, whole(b)) for a, b in zip(buffers_before, buffers))
    return dict(error=error, unchanged=unchanged, early_open=early_open, redone=redone, num_layers=len(SHAPES))


# Same-shape layers (one shape class of six), so that stage spreading moves owners, and a
# last layer of its own shape.
SPREAD_SHAPES = [(8, 8)] * 6 + [(12, 5)]


class LayersModel(nn.Module):
    """ProbeModel's loss over `shapes` (no bias): each weight's gradient is its target."""

    def __init__(self, shapes: list[tuple[int, int]]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=False) for o, i in shapes)

    def forward(self, targets: list[torch.Tensor]) -> torch.Tensor:
        loss = torch.zeros(())
        for layer, g in zip(self.layers, targets):
            loss = loss + (layer(torch.eye(layer.in_features, dtype=g.dtype)) * g.T).sum()
        return loss


def spread_plan_matches_post_backward(rank: int, world: int) -> dict:
    """FSDP2 with one unit per pair of same-shape layers: NUM_STEPS steps begun from backward
    (stage-spread plan, stages = backward windows, one per unit) against the post-backward
    step (the planner's plan as solved) of the same gradients; per weight ‖Δon − Δoff‖ /
    ‖Δoff‖, both runtimes' owners, early stages."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    base = LayersModel(SPREAD_SHAPES)
    models = {on: copy.deepcopy(base) for on in (True, False)}
    initial = {on: wholes(m) for on, m in models.items()}
    mesh = init_device_mesh("cpu", (world,))
    wrapped = {}
    for on, m in models.items():
        for k in range(0, 6, 2):
            fully_shard([m.layers[k], m.layers[k + 1]], mesh=mesh)
        fully_shard(m.layers[6], mesh=mesh)
        wrapped[on] = fully_shard(m, mesh=mesh)
    opts = {on: dmuon.DMuon(m, execution=dmuon.Execution(backward_step=on, planner="lpt", bucket_size_mb=0.0005),
                            **{k: v for k, v in OPTIONS.items() if k != "bucket_size_mb"})
            for on, m in models.items()}
    early = []
    for step in range(NUM_STEPS):
        gen = torch.Generator().manual_seed(200 + step)
        targets = [torch.randn(*s, generator=gen) / s[1] ** 0.5 for s in SPREAD_SHAPES]
        for on in (True, False):
            opts[on].zero_grad()
            wrapped[on](targets).backward()
            opts[on].step()
        stats = opts[True].runtime.last_stats
        early.append((stats.early_stages, stats.num_buckets))
    errors = update_errors(models[True], initial[True], models[False], initial[False])
    return dict(errors=errors, early=early, owners={on: list(opts[on].runtime.item_owners) for on in (True, False)})


class Block(nn.Module):
    """Six Muon matrices (q, k, v, o: width², up and down: 4 width × width), residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(width, 4 * width, bias=False), nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.o(self.q(x) * torch.sigmoid(self.k(x)) + self.v(x))
        return x + self.down(torch.relu(self.up(x)))


class BlocksModel(nn.Module):
    """`num_blocks` Blocks, then a LayerNorm: the root's own FSDP2 group, as a decoder's
    final norm, so that the last block is handed over at the end of backward."""

    def __init__(self, num_blocks: int, width: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(num_blocks))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x).square().mean()


def engine_threads_and_group(rank: int, world: int) -> dict:
    """An 8-block FSDP2 model with backward_step on: its second backward under torch.profiler
    (CPU), the threads of the hooks' and of the engine's host ranges; the runtime's own group."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = BlocksModel(8)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = dmuon.DMuon(model, lr=0.02, execution=dmuon.Execution(backward_step=True))
    threads: dict[str, set] = {"dmuon.backward_step.params_final": set(), "dmuon.backward_step.engine": set()}
    for step in range(2):
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(700 + step + rank))
        opt.zero_grad()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(x).backward()
            opt.step()
    for event in prof.events():
        if event.name in threads:
            threads[event.name].add(event.thread)
    (engine_group,) = opt._engine_groups.values()
    return dict(hook_threads=threads["dmuon.backward_step.params_final"],
                engine_threads=threads["dmuon.backward_step.engine"],
                engine_group_ranks=dist.get_process_group_ranks(engine_group),
                same_group=engine_group is mesh.get_group(), early_stages=opt.runtime.last_stats.early_stages)


def default_blocks_match_post_backward(rank: int, world: int, clip: bool, units: str = "block") -> dict:
    """An 8-block model under FSDP2 (fully_shard per block and the root; `units` "root":
    the root only) with DMuon at its default options but backward_step on, against off:
    NUM_STEPS steps, `clip` scaling the gradients after backward (clip_grad_norm_);
    per weight ‖Δon − Δoff‖ / ‖Δoff‖, per step the share of this rank's NS matrices that
    ran before backward ended, and the warnings the runtime gave."""
    import warnings

    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    base = BlocksModel(8)
    models = {on: copy.deepcopy(base) for on in (True, False)}
    initial = {on: wholes(m) for on, m in models.items()}
    mesh = init_device_mesh("cpu", (world,))
    for m in models.values():
        for block in (m.blocks if units == "block" else []):
            fully_shard(block, mesh=mesh)
        fully_shard(m, mesh=mesh)
    opts = {on: dmuon.DMuon(m, lr=0.02, execution=dmuon.Execution(backward_step=on)) for on, m in models.items()}
    shares, caught = [], []
    for step in range(NUM_STEPS):
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(300 + 10 * step + rank))
        for on in (True, False):
            opts[on].zero_grad()
            models[on](x).backward()
            if clip:  # NOTE: scales the gradients in place after they were handed over
                torch.nn.utils.clip_grad_norm_(models[on].parameters(), 0.05)
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                opts[on].step()
            caught += [str(w.message) for w in got if "backward_step" in str(w.message)]
        stats = opts[True].runtime.last_stats
        shares.append(stats.early_orthogonalized / stats.num_orthogonalized)
    errors = update_errors(models[True], initial[True], models[False], initial[False])
    return dict(errors=errors, shares=shares, warnings=caught, stages=opts[True].runtime.num_buckets)
