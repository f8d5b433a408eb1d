"""Rank functions of test_backward_step.py: the step begun inside backward
(Execution.backward_step=True) against the post-backward step (False) of the same model,
plan and gradients, in FSDP2, HSDP and DDP, with and without gradient accumulation; and a
NaN in a late layer's gradient. On Gloo CPU processes (test_backward_step) and over NCCL,
one GPU per rank (dist_workers.nccl_scenarios, test_multigpu)."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from all_modes_workers import OPTIONS, SHAPES, ProbeModel, _targets, wrap
from dist_workers import _device
from worker_tensors import update_errors, whole, wholes

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


def backward_matches_post_backward(rank: int, world: int, mode: str, micro: int, clip: bool = False) -> dict:
    """NUM_STEPS steps with backward_step on and off; per weight, ‖Δon − Δoff‖ / ‖Δoff‖,
    and the begun step's statistics of the last step."""
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
    early = []
    for step in range(NUM_STEPS):
        for on in (True, False):
            opts[on].zero_grad()
            _backward(wrapped[on], mode, step, micro)
            if clip:  # NOTE: scales the gradients in place after they were handed over
                torch.nn.utils.clip_grad_norm_(models[on].parameters(), 0.05)
            opts[on].step()
        stats = opts[True].runtime.last_stats
        early.append((stats.early_stages, stats.num_buckets, stats.early_orthogonalized, stats.num_orthogonalized))
    errors = update_errors(models[True], initial[True], models[False], initial[False])
    return dict(errors=errors, early=early, backward_on=opts[True]._backward_step_on,
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
    # Whether step() found the begun work stale (then it is dropped and the step redone
    # from the gradients, and the begun step's own check is never what refuses it).
    take, redone = opt._backward.take, []

    def spy():
        fresh, changed = take()
        redone.append(changed)
        return fresh, changed

    opt._backward.take = spy
    error = ""
    try:
        opt.step()
    except dmuon.NonFiniteGradientError as e:
        error = str(e)
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
