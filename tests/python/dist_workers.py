"""Worker functions for the distributed tests (run in spawned processes by dist_harness).

Device-aware: under Gloo they compute on the CPU (tests/python/test_distributed.py), under
NCCL on this rank's GPU (tests/python/test_multigpu.py), with the same code and checks.
The single-process reference is DMuon on a process group of this rank alone, so it never
communicates, whatever the default group is."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dmuon
from worker_tensors import reference_of, rel, update_errors, whole, wholes

# Awkward shapes: tiny, thin, dim 0 smaller than the world, not divisible by it, a 3-D
# expert stack, a 4-D conv weight.
SHAPES = [(16, 24), (5, 7), (1, 64), (3, 300), (2, 9), (7, 5), (5, 6, 8), (6, 3, 2, 2)]


def _device() -> torch.device:
    """This rank's GPU under NCCL (one process per GPU), else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _exact_options() -> dict:
    """DMuon options that keep the distributed step bit-comparable to one process.
    NOTE: on GPUs the wire defaults to bfloat16, which rounds what is exchanged; float32
    on the wire carries the fp32 momentum and updates exactly, so the CPU suite's 1e-5
    tolerance still holds there (every shape in SHAPES is distinct, so each Newton–Schulz
    call sees one parameter, as in the single process). test_multigpu checks the bfloat16
    wire separately (production_precision_matches_single_process)."""
    return {"wire_dtype": "float32"} if _device().type == "cuda" else {}


_OWN_GROUPS: list = []


def _own_group():
    """A process group holding only this rank (created once, collectively, by all ranks)."""
    if not _OWN_GROUPS:
        world = dist.get_world_size()
        # NOTE: Gloo groups: the reference never communicates, so no NCCL communicator is needed.
        _OWN_GROUPS.extend(dist.new_group([r], backend="gloo") for r in range(world))
    return _OWN_GROUPS[dist.get_rank()]


def _single_process_dmuon(params, **options):
    """The single-process reference: DMuon on a one-rank group (no exchange, no plan sharing)."""
    return dmuon.DMuon(params, process_group=_own_group(), **options)


def _global_tensors(seed: int, shapes=SHAPES, device: torch.device | None = None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=gen) / s[-1] ** 0.5).to(device or _device()) for s in shapes]


def _lr_scale(params: list[torch.Tensor], exact: list[torch.Tensor], initial: list[torch.Tensor]) -> float:
    """How many times the float64 reference's update the run's is, over every parameter: the
    least-squares scale <u, r> / <r, r> of the updates u (the run's, from `initial`) and r
    (the reference's). An lr off by 1% moves it by 1e-2; Newton–Schulz rounding, which is not
    a scale, moves it little: ≤ 3.3e-3 with float16 NS and bfloat16 gradients (20 draws of
    SHAPES through dmuon.reference in float16 against float64, 3 steps), ~1e-6 in float32."""
    num = den = 0.0
    for p, q, p0 in zip(params, exact, initial):
        u = (whole(p) - p0).double().flatten().cpu()
        r = (q.detach() - p0).double().flatten().cpu()
        num, den = num + float(u @ r), den + float(r @ r)
    return num / den


def sharded_and_replicated_match_single_process(rank: int, world: int, algorithm: str, num_steps: int = 3,
                                                hsdp: bool = False) -> dict:
    """Owner mode (sharded and replicated) and gather mode against single-process DMuon."""
    options = dict(lr=0.02, weight_decay=0.1, ns_algorithm=algorithm, bucket_size_mb=0.001, **_exact_options())
    initial = _global_tensors(0)
    single = [nn.Parameter(t.clone()) for t in initial]
    single_opt = _single_process_dmuon([(f"w{i}", p) for i, p in enumerate(single)], **options)
    # NOTE: the independent oracle: the pure-PyTorch float64 reference, so that the
    # distributed runs are not only compared with DMuon itself.
    exact = [nn.Parameter(t.clone()) for t in initial]
    exact_opt = reference_of(single_opt, exact)

    device_type = _device().type
    if hsdp:
        mesh = init_device_mesh(device_type, (2, world // 2), mesh_dim_names=("replicate", "shard"))
        placements = [Replicate(), Shard(0)]
    else:
        mesh = init_device_mesh(device_type, (world,))
        placements = [Shard(0)]
    sharded = [nn.Parameter(distribute_tensor(t.clone(), mesh, placements)) for t in initial]
    sharded_opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(sharded)], **options)
    gathered = [nn.Parameter(distribute_tensor(t.clone(), mesh, placements)) for t in initial]
    gather_opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(gathered)], mode="gather", **options)
    replicated = [nn.Parameter(t.clone()) for t in initial]
    replicated_opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(replicated)], **options)

    for step in range(num_steps):
        grads = _global_tensors(100 + step)
        for p, g in zip(single, grads):
            p.grad = g.clone()
        for p, g in zip(exact, grads):
            p.grad = g.clone()
        exact_opt.step()
        for p, g in zip(replicated, grads):
            p.grad = g.clone()
        for ps in (sharded, gathered):
            for p, g in zip(ps, grads):
                p.grad = distribute_tensor(g.clone(), mesh, placements)
        for opt in (single_opt, sharded_opt, gather_opt, replicated_opt):
            opt.step()

    errors = {"sharded": [], "gather": [], "replicated": []}
    reference_errors = [rel(p, q) for p, q in zip(single, exact)]
    lr_scales = {name: _lr_scale(ps, exact, initial) for name, ps in (
        ("single", single), ("sharded", sharded), ("gather", gathered), ("replicated", replicated))}
    for i, ref in enumerate(single):
        errors["sharded"].append(rel(sharded[i].full_tensor(), ref.detach()))
        errors["gather"].append(rel(gathered[i].full_tensor(), ref.detach()))
        errors["replicated"].append(rel(replicated[i].detach(), ref.detach()))
    stats = sharded_opt.runtime.last_stats
    return {"errors": errors, "reference_errors": reference_errors, "lr_scales": lr_scales,
            "owners": sharded_opt.runtime.owners,
            "num_buckets": stats.num_buckets,
            "num_orthogonalized": stats.num_orthogonalized, "bytes_sent": stats.bytes_sent,
            "replicated_orthogonalized": replicated_opt.runtime.last_stats.num_orthogonalized,
            "gather_orthogonalized": gather_opt.runtime.last_stats.num_orthogonalized}


def mismatched_parameters(rank: int, world: int) -> str:
    """Rank 1 builds a different parameter list: every rank must raise (not hang)."""
    shape = (4, 6) if rank != 1 else (4, 7)
    device = _device()
    params = [("embed", nn.Parameter(torch.randn(10, 3, device=device))),
              ("proj", nn.Parameter(torch.randn(*shape, device=device)))]
    try:
        dmuon.DMuon(params, process_group=dist.group.WORLD)
    except ValueError as error:
        return str(error)
    return "no error"


class TinyTransformer(nn.Module):
    """Embedding, one attention-ish block and an MLP, a head: enough for FSDP2/DDP tests."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        # NOTE: no bias: the key bias has an exactly-zero gradient (softmax is shift
        # invariant), and AdamW turns that gradient's rounding noise into ±lr steps.
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.up = nn.Linear(dim, 40)
        self.down = nn.Linear(40, dim)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1) @ v
        h = h + self.proj(attn)
        h = h + self.down(torch.relu(self.up(self.norm(h))))
        return self.lm_head(h)


def _batches(step: int, world: int, per_rank: int = 2, seq: int = 6) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, 32, (world * per_rank, seq), generator=gen).to(_device())


def _loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def wrapped_training_matches_single_process(rank: int, world: int, wrapper: str, num_steps: int = 3,
                                            extra: dict | None = None) -> dict:
    """FSDP2 fully_shard or DDP training vs single-process DMuon on the whole batch.
    NOTE: FSDP2 on Gloo was reported to sum gradients instead of averaging them; with
    torch 2.11 its gradients are means (measured), so no correction is applied and this
    comparison would catch a regression.
    Returns per parameter the error relative to the reference parameter ("errors") and
    relative to the reference's total change ("update_errors").
    NOTE: on GPUs the model is float64, so Newton–Schulz iterates in float64 on both sides.
    With a float32 model it iterates in float16 there, and the split batch's gradients differ
    from the whole batch's in the last bits: the updates of the two differed by 3.4% on
    up.weight (H200 pair, DDP and FSDP2 alike, also with both on the bucketed path). Likely
    why: the quintic's slope at 0 is a = 3.4445, so five steps can multiply a perturbation
    in the gradient's near-null directions by up to a^5 ≈ 490. That says nothing about the
    sharding; float64 leaves only the summation order. The float16 path is checked by the
    production-precision scenario and by the single-GPU tests."""
    torch.manual_seed(0)
    device = _device()
    dtype = torch.float64 if device.type == "cuda" else torch.float32
    reference = TinyTransformer().to(device=device, dtype=dtype)
    model = copy.deepcopy(reference)
    initial = wholes(reference)
    options = dict(lr=0.01, weight_decay=0.05, **_exact_options(), **(extra or {}))
    ref_opt = _single_process_dmuon(reference, **options)
    if wrapper == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for layer in (model.qkv, model.proj, model.up, model.down):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = dmuon.DMuon(model, **options)
        wrapped = model
    else:
        wrapped = nn.parallel.DistributedDataParallel(model)
        opt = dmuon.DMuon(model, **options)

    train_beside_reference(rank, world, reference, ref_opt, opt, lambda mine: _loss(wrapped, mine).backward(),
                           num_steps, per_rank=2)
    errors, update_errors = errors_against_reference(model, reference, initial)
    return {"errors": errors, "update_errors": update_errors, "owners": opt.runtime.owners,
            "state_errors": {name: rel(whole(opt.state[p][key]), ref_opt.state[q][key])
                             for (name, p), q in zip(model.named_parameters(), reference.parameters())
                             for key in opt.state.get(p, {}) if key == "normuon_v"}}


def train_beside_reference(rank: int, world: int, reference: nn.Module, ref_opt, opt, backward,
                           num_steps: int, per_rank: int) -> None:
    """Each step: the single-process reference on the whole batch of world·per_rank
    sequences, then backward(this rank's per_rank sequences) and opt.step()."""
    for step in range(num_steps):
        tokens = _batches(step, world, per_rank)
        ref_opt.zero_grad()
        _loss(reference, tokens).backward()
        ref_opt.step()
        opt.zero_grad()
        backward(tokens[rank * per_rank:(rank + 1) * per_rank])
        opt.step()


def errors_against_reference(model: nn.Module, reference: nn.Module, initial: dict) -> tuple[dict, dict]:
    """Per parameter of `model` (whole tensors: DTensors are gathered): the error relative to
    the reference parameter, and relative to the reference's change since `initial` (the
    wholes() both models started from)."""
    now, ref = wholes(model), wholes(reference)
    return {n: rel(now[n], ref[n]) for n in now}, update_errors(model, initial, reference, initial)


def profiled_costs_give_one_plan(rank: int, world: int) -> dict:
    """cost_model="profile": the engine of rank 0 times the NS, every rank plans from its
    table (the same table and plan on every rank)."""
    initial = _global_tensors(0)
    mesh = init_device_mesh(_device().type, (world,))
    params = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for t in initial]
    single = [nn.Parameter(t.clone()) for t in initial]
    opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)], lr=0.02, cost_model="profile",
                      **_exact_options())
    single_opt = _single_process_dmuon([(f"w{i}", p) for i, p in enumerate(single)], lr=0.02, cost_model="analytic",
                                       **_exact_options())
    grads = _global_tensors(7)
    for p, q, g in zip(params, single, grads):
        p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
        q.grad = g.clone()
    opt.step()
    single_opt.step()
    errors = [rel(p.full_tensor(), q.detach()) for p, q in zip(params, single)]
    return {"plan": opt.runtime.plan_text, "costs": list(opt.runtime.cost_entries), "errors": errors}


def nonfinite_on_one_rank(rank: int, world: int, policy: str) -> dict:
    """Step 2 has one NaN, in the last rank's shard of a matrix and nowhere else (policy
    "raise": also an Inf in a 3-D expert stack on every rank that holds rows of it): every
    rank must raise (naming the parameter and step) or skip the step, changing no parameter
    and no momentum buffer."""
    initial = _global_tensors(0)
    mesh = init_device_mesh(_device().type, (world,))
    params = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for t in initial]
    opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)], lr=0.02, nonfinite=policy)

    def state() -> list[torch.Tensor]:
        buffers = [opt.state[p]["momentum_buffer"] for p in params if "momentum_buffer" in opt.state[p]]
        return [t.full_tensor().clone() for t in (*params, *buffers)]

    for step in range(2):
        for p, g in zip(params, _global_tensors(50 + step)):
            p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
        if step == 1:
            if rank == world - 1:
                params[0].grad.to_local()[0, 0] = float("nan")  # a 2-D matrix, last rank only
            stack = params[6].grad.to_local()  # the 3-D expert stack (5, 6, 8)
            if policy == "raise" and stack.numel():
                stack.view(-1)[-1] = float("inf")
        before = state()
        try:
            opt.step()
        except dmuon.NonFiniteGradientError as error:
            return {"raised": str(error), "unchanged": all(torch.equal(a, b) for a, b in zip(state(), before))}
    after = state()
    unchanged = len(after) == len(before) == 2 * len(params) and all(torch.equal(a, b) for a, b in zip(after, before))
    return {"unchanged": unchanged, "skipped": opt.param_groups[0]["num_skipped_steps"],
            "steps": opt.param_groups[0]["num_steps"]}


def adamw_part_fails_on_one_rank(rank: int, world: int) -> dict:
    """Step 2's AdamW part raises on the last rank only, after the engine has applied the
    Muon part and before the step's result agreement (deferred behind the AdamW part with
    several ranks): that rank must raise its own error, the others step, nobody waits for
    an agreement the failing rank never joined, and the next step is refused on every rank
    (that rank's state may be torn)."""
    initial = _global_tensors(0)
    mesh = init_device_mesh(_device().type, (world,))
    params = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for t in initial]
    bias = nn.Parameter(distribute_tensor(torch.zeros(10, device=_device()), mesh, [Shard(0)]))
    opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)] + [("bias", bias)], lr=0.02)
    assert not opt.param_groups[-1]["use_muon"], "the 1-D bias is AdamW's"
    adamw_step = opt._adamw_group_step
    out: dict = {}
    for step in range(3):
        for p, g in zip([*params, bias], [*_global_tensors(70 + step), torch.full((10,), 0.1)]):
            p.grad = distribute_tensor(g.to(_device()), mesh, [Shard(0)])
        failing = step == 1 and rank == world - 1
        if failing:
            def broken(group, active):
                raise RuntimeError(f"AdamW part broken on rank {rank}")
            opt._adamw_group_step = broken
        try:
            opt.step()
            out[f"step {step + 1}"] = "stepped"
        except RuntimeError as error:
            out[f"step {step + 1}"] = str(error)
        finally:
            opt._adamw_group_step = adamw_step
    out["bias moved"] = not torch.equal(bias.full_tensor(), torch.zeros(10, device=_device()))
    return out


def a_rank_dies_mid_training(rank: int, world: int, how: str = "exit") -> str:
    """The last rank exits (or stalls past the collective timeout) between steps; the
    others' next step must fail, naming the step and the collective, instead of hanging."""
    import os
    import time

    initial = _global_tensors(0)
    mesh = init_device_mesh("cpu", (world,))
    params = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for t in initial]
    opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)], lr=0.02)
    from torch.distributed.tensor import DTensor

    for step in range(2):
        if step == 1 and rank == world - 1:
            if how == "exit":
                os._exit(17)
            time.sleep(12)  # stalls well past the 5 s collective timeout
            return "stalled"
        for p, g in zip(params, _global_tensors(60 + step)):
            # NOTE: local shards wrapped without communication, so that the optimizer's
            # own collectives are the first to meet the dead rank.
            local = p.to_local()
            chunks = list(torch.chunk(g, world)) + [g[:0]] * world
            p.grad = DTensor.from_local(chunks[rank].reshape(local.shape).clone(), mesh, [Shard(0)],
                                        run_check=False, shape=g.shape, stride=g.stride())
        opt.step()
    return "no error"


def production_precision_matches_single_process(rank: int, world: int, num_steps: int = 3) -> dict:
    """Default options (on GPUs: bfloat16 on the wire, Newton–Schulz in float16): each step's
    update of owner mode (sharded), gather mode and replicated owner mode, per parameter,
    relative to the single-process update on this device. Also what gather mode sent: with
    every matrix sharded, each rank sends its rows of every matrix to the world − 1 others."""
    options = dict(lr=0.02, weight_decay=0.0, bucket_size_mb=0.001)
    initial = _global_tensors(0)
    mesh = init_device_mesh(_device().type, (world,))
    single = [nn.Parameter(t.clone()) for t in initial]
    runs = {"single": (single, _single_process_dmuon([(f"w{i}", p) for i, p in enumerate(single)], **options))}
    # NOTE: the independent oracle (float64 Newton–Schulz): an error shared by every DMuon
    # run (an lr off by 1%) shows only against it.
    exact = [nn.Parameter(t.clone()) for t in initial]
    exact_opt = reference_of(runs["single"][1], exact)
    for name, mode, sharded in (("sharded", "owner", True), ("gather", "gather", True), ("replicated", "owner", False)):
        params = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)]) if sharded else t.clone())
                  for t in initial]
        runs[name] = (params, dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)], mode=mode, **options))

    def full(p: torch.Tensor) -> torch.Tensor:
        return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()

    errors = {name: [0.0] * len(initial) for name in runs if name != "single"}
    for step in range(num_steps):
        grads = _global_tensors(200 + step)
        before = {name: [full(p) for p in params] for name, (params, _) in runs.items()}
        for name, (params, opt) in runs.items():
            for p, g in zip(params, grads):
                p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)]) if hasattr(p, "full_tensor") else g.clone()
            opt.step()
        for p, g in zip(exact, grads):
            p.grad = g.clone()
        exact_opt.step()
        single_updates = [full(p) - b for p, b in zip(single, before["single"])]
        for name in errors:
            for i, (p, b) in enumerate(zip(runs[name][0], before[name])):
                errors[name][i] = max(errors[name][i], rel(full(p) - b, single_updates[i]))
    gather_stats = runs["gather"][1].runtime.last_stats
    return {"errors": errors, "finite": all(torch.isfinite(full(p)).all().item() for ps, _ in runs.values() for p in ps),
            "lr_scales": {name: _lr_scale(params, exact, initial) for name, (params, _) in runs.items()},
            "gather_bytes_sent": gather_stats.bytes_sent,
            "local_numels": [p.to_local().numel() for p in runs["gather"][0]],
            "wire_element_size": 2 if _device().type == "cuda" else 4}


# The distributed checks of the CPU suite, in one process group (one launch per world size).
# NOTE: scenario names are what test_multigpu asserts on; each returns the worker's result
# or {"error": traceback}. A scenario that fails on some ranks only can leave the others in
# a collective: the launcher's deadline and the collective timeout end the run then.
def nccl_scenarios(world: int) -> list[tuple[str, Any, tuple]]:
    scenarios = [
        ("sharded-gram", sharded_and_replicated_match_single_process, ("gram",)),
        ("sharded-standard", sharded_and_replicated_match_single_process, ("standard",)),
        ("fsdp2", wrapped_training_matches_single_process, ("fsdp2",)),
        ("ddp", wrapped_training_matches_single_process, ("ddp",)),
        ("profiled-plan", profiled_costs_give_one_plan, ()),
        ("nonfinite-raise", nonfinite_on_one_rank, ("raise",)),
        ("nonfinite-skip", nonfinite_on_one_rank, ("skip",)),
        ("mismatched", mismatched_parameters, ()),
        ("production", production_precision_matches_single_process, ()),
    ]
    if world >= 4 and world % 2 == 0:
        scenarios.insert(2, ("hsdp", sharded_and_replicated_match_single_process, ("gram", 2, True)))
    # The step begun inside backward against the post-backward step (test_backward_step).
    import test_backward_step as bstep

    scenarios += [
        ("backward-step-fsdp2", bstep.backward_matches_post_backward, ("fsdp2", 1)),
        ("backward-step-ddp", bstep.backward_matches_post_backward, ("ddp", 1)),
        ("backward-step-accumulate", bstep.backward_matches_post_backward, ("fsdp2", 3)),
        ("backward-step-nan", bstep.nan_in_late_layer, ("fsdp2",)),
    ]
    if world >= 4 and world % 2 == 0:
        scenarios.append(("backward-step-hsdp", bstep.backward_matches_post_backward, ("hsdp", 1)))
    return scenarios


def all_scenarios(rank: int, world: int) -> dict:
    """Every scenario of nccl_scenarios(world) in turn, in this process group."""
    import sys
    import traceback

    results = {}
    for name, fn, args in nccl_scenarios(world):
        try:
            results[name] = fn(rank, world, *args)
        except Exception:  # noqa: BLE001 - reported per scenario, the others still run
            text = traceback.format_exc()
            print(f"rank {rank}: scenario {name} failed:\n{text}", file=sys.stderr, flush=True)
            results[name] = {"error": text}
    return results


def one_rank_fails_while_the_other_waits(rank: int, world: int) -> str:
    """The last rank raises at once; the others stay blocked, like ranks left in an NCCL
    collective that the failed rank never joins (a Gloo collective would fail at once when
    the peer's connection closes, so they sleep instead)."""
    import time

    if rank == world - 1:
        raise RuntimeError(f"rank {rank} gives up")
    time.sleep(120)
    return "no error"


def ddp_replicas_after_bf16_wire_steps(rank: int, world: int, num_steps: int = 4) -> dict:
    """DDP (replicated matrices, each orthogonalized on its owner and sent to the others on a
    bfloat16 wire) for `num_steps` steps of different data per rank: every parameter's bytes
    (to compare between ranks), the owners, and whether the steps moved the parameters."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24, bias=False), nn.Tanh(), nn.Linear(24, 20, bias=False), nn.Tanh(),
                          nn.Linear(20, 12, bias=False))
    initial = [p.detach().clone() for p in model.parameters()]
    wrapped = nn.parallel.DistributedDataParallel(model)
    opt = dmuon.DMuon(model, lr=0.02, weight_decay=0.1, execution=dmuon.Execution(wire_dtype="bfloat16", planner="lpt"))
    for step in range(num_steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + rank))
        opt.zero_grad()
        wrapped(x).pow(2).mean().backward()
        opt.step()
    return {"bytes": [p.detach().numpy().tobytes() for p in model.parameters()], "owners": list(opt.runtime.owners),
            "moved": all(not torch.equal(p, q) for p, q in zip(model.parameters(), initial))}
