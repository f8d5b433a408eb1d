"""Worker functions for the distributed tests (run in spawned processes by dist_harness)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dmuon

# Awkward shapes: tiny, thin, dim 0 smaller than the world, not divisible by it, a 3-D
# expert stack, a 4-D conv weight.
SHAPES = [(16, 24), (5, 7), (1, 64), (3, 300), (2, 9), (7, 5), (5, 6, 8), (6, 3, 2, 2)]


def _global_tensors(seed: int, shapes=SHAPES) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen) / s[-1] ** 0.5 for s in shapes]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def sharded_and_replicated_match_single_process(rank: int, world: int, algorithm: str, num_steps: int = 3,
                                                hsdp: bool = False) -> dict:
    """Owner mode (sharded and replicated) and gather mode against single-process DMuon."""
    options = dict(lr=0.02, weight_decay=0.1, ns_algorithm=algorithm, bucket_size_mb=0.001)
    initial = _global_tensors(0)
    single = [nn.Parameter(t.clone()) for t in initial]
    single_opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(single)], **options)

    if hsdp:
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        placements = [Replicate(), Shard(0)]
    else:
        mesh = init_device_mesh("cpu", (world,))
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
        for p, g in zip(replicated, grads):
            p.grad = g.clone()
        for ps in (sharded, gathered):
            for p, g in zip(ps, grads):
                p.grad = distribute_tensor(g.clone(), mesh, placements)
        for opt in (single_opt, sharded_opt, gather_opt, replicated_opt):
            opt.step()

    errors = {"sharded": [], "gather": [], "replicated": []}
    for i, ref in enumerate(single):
        errors["sharded"].append(_rel(sharded[i].full_tensor(), ref.detach()))
        errors["gather"].append(_rel(gathered[i].full_tensor(), ref.detach()))
        errors["replicated"].append(_rel(replicated[i].detach(), ref.detach()))
    stats = sharded_opt.runtime.last_stats
    return {"errors": errors, "owners": sharded_opt.runtime.owners, "num_buckets": stats.num_buckets,
            "num_orthogonalized": stats.num_orthogonalized, "bytes_sent": stats.bytes_sent,
            "replicated_orthogonalized": replicated_opt.runtime.last_stats.num_orthogonalized,
            "gather_orthogonalized": gather_opt.runtime.last_stats.num_orthogonalized}


def mismatched_parameters(rank: int, world: int) -> str:
    """Rank 1 builds a different parameter list: every rank must raise (not hang)."""
    shape = (4, 6) if rank != 1 else (4, 7)
    params = [("embed", nn.Parameter(torch.randn(10, 3))), ("proj", nn.Parameter(torch.randn(*shape)))]
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
    return torch.randint(0, 32, (world * per_rank, seq), generator=gen)


def _loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def wrapped_training_matches_single_process(rank: int, world: int, wrapper: str, num_steps: int = 3) -> dict:
    """FSDP2 fully_shard or DDP training vs single-process DMuon on the whole batch.
    NOTE: FSDP2 on Gloo was reported to sum gradients instead of averaging them; with
    torch 2.11 its gradients are means (measured), so no correction is applied and this
    comparison would catch a regression."""
    torch.manual_seed(0)
    reference = TinyTransformer()
    model = copy.deepcopy(reference)
    options = dict(lr=0.01, weight_decay=0.05)
    ref_opt = dmuon.DMuon(reference, **options)
    if wrapper == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in (model.qkv, model.proj, model.up, model.down):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = dmuon.DMuon(model, **options)
        wrapped = model
    else:
        wrapped = nn.parallel.DistributedDataParallel(model)
        opt = dmuon.DMuon(model, **options)

    per_rank = 2
    for step in range(num_steps):
        tokens = _batches(step, world, per_rank)
        ref_opt.zero_grad()
        _loss(reference, tokens).backward()
        ref_opt.step()
        opt.zero_grad()
        _loss(wrapped, tokens[rank * per_rank:(rank + 1) * per_rank]).backward()
        opt.step()

    errors = {}
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        errors[name] = _rel(full.detach(), q.detach())
    return {"errors": errors, "owners": opt.runtime.owners}


def profiled_costs_give_one_plan(rank: int, world: int) -> dict:
    """cost_model="profile": rank 0 times the NS, every rank plans from the same table."""
    import tempfile

    initial = _global_tensors(0)
    mesh = init_device_mesh("cpu", (world,))
    params = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for t in initial]
    single = [nn.Parameter(t.clone()) for t in initial]
    cache = tempfile.mkdtemp() + "/costs.txt" if rank == 0 else None
    opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)], lr=0.02, cost_model="profile", cost_cache=cache)
    single_opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(single)], lr=0.02, cost_model="analytic")
    grads = _global_tensors(7)
    for p, q, g in zip(params, single, grads):
        p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
        q.grad = g.clone()
    opt.step()
    single_opt.step()
    errors = [_rel(p.full_tensor(), q.detach()) for p, q in zip(params, single)]
    return {"plan": opt.runtime.plan_text, "errors": errors}


def nonfinite_on_one_rank(rank: int, world: int, policy: str) -> dict:
    """NaN in one rank's shard of a matrix and Inf in a 3-D expert stack: every rank must
    raise (naming the parameter and step) or skip the step, changing nothing."""
    initial = _global_tensors(0)
    mesh = init_device_mesh("cpu", (world,))
    params = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for t in initial]
    opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)], lr=0.02, nonfinite=policy)
    for step in range(2):
        for p, g in zip(params, _global_tensors(50 + step)):
            p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
        if step == 1:
            if rank == world - 1:
                params[0].grad.to_local()[0, 0] = float("nan")  # a 2-D matrix, last rank only
            stack = params[6].grad.to_local()  # the 3-D expert stack (5, 6, 8)
            if stack.numel():
                stack.view(-1)[-1] = float("inf")
        before = [p.full_tensor().clone() for p in params]
        try:
            opt.step()
        except dmuon.NonFiniteGradientError as error:
            return {"raised": str(error)}
    unchanged = all(torch.equal(p.full_tensor(), b) for p, b in zip(params, before))
    return {"unchanged": unchanged, "skipped": opt.param_groups[0]["num_skipped_steps"],
            "steps": opt.param_groups[0]["num_steps"]}


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
