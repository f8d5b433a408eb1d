"""Workers and model of the split-orthogonalization tests (tests/python/
test_split_orthogonalization.py): a tiny decoder block with a fused q, k, v (GQA), per-head q,
per-head o (column blocks), a fused gate/up, trained on one process or under Gloo (FSDP2,
DDP) against the reference."""

from __future__ import annotations

import copy

import torch
from torch import nn

import dmuon
from worker_tensors import reference_of, update_errors, whole_numpy, wholes

# Rows: fused q, k, v = 12 + 6 + 6 (GQA: 4 q heads, 2 kv heads of 3 rows); gate/up = 2 × 20.
QKV_ROWS = (12, 6, 6)
HEADS = 4
INTER = 20
# o_proj is [12, 36]: 4 column blocks (heads) of 9 columns, each a 12x9 matrix.
O_HEADS = 4


class SplitBlock(nn.Module):
    """Embedding → fused qkv, per-head o, fused gate_up, down → head (no attention math:
    what matters is that every matrix gets a gradient)."""

    def __init__(self, hidden: int = 12, vocab: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.qkv_proj = nn.Linear(hidden, sum(QKV_ROWS), bias=False)
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(sum(QKV_ROWS) + hidden, hidden, bias=False)
        self.gate_up_proj = nn.Linear(hidden, 2 * INTER, bias=False)
        self.down_proj = nn.Linear(INTER, hidden, bias=False)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.o_proj(torch.cat([self.qkv_proj(x), self.q_proj(x)], -1).tanh())
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        x = x + self.down_proj(torch.nn.functional.silu(gate) * up)
        return self.lm_head(x)


def split_groups(model: nn.Module, **options) -> list[dict]:
    """One group per split (named parameters), the rest routed (Muon / AdamW)."""
    named = dict(model.named_parameters())
    strip = lambda n: n.removeprefix("module.")  # noqa: E731
    pick = lambda leaf: [(n, p) for n, p in named.items() if strip(n).startswith(leaf)]  # noqa: E731
    split = {"qkv_proj", "q_proj", "gate_up_proj", "o_proj"}
    rest = [(n, p) for n, p in named.items() if strip(n).split(".")[0] not in split]
    return [{"params": pick("qkv_proj"), "use_muon": True, "split_rows": list(QKV_ROWS), **options},
            {"params": pick("q_proj"), "use_muon": True, "split_heads": HEADS, **options},
            {"params": pick("gate_up_proj"), "use_muon": True, "split_rows": [INTER, INTER], **options},
            {"params": pick("o_proj"), "use_muon": True, "split_heads": O_HEADS, "split_dim": 1, **options},
            {"params": rest}]


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, 32, (4, 5), generator=torch.Generator().manual_seed(step))


def loss_step(model: nn.Module, optimizer, step: int) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(batch(step)).pow(2).mean().backward()
    optimizer.step()


def wrap(model: nn.Module, wrapper: str, world: int) -> nn.Module:
    """FSDP2 on every parameter's module (Shard(0): uneven chunks cut the blocks), or DDP."""
    if wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for module in model.children():
            fully_shard(module, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return nn.parallel.DistributedDataParallel(model)


def sharded_matches_the_reference(rank: int, world: int, wrapper: str) -> dict:
    """3 steps of DMuon under `wrapper` against the single-process reference (fp64 NS)."""
    torch.manual_seed(0)
    model = SplitBlock()
    exact = copy.deepcopy(model)
    model = wrap(model, wrapper, world)
    optimizer = dmuon.DMuon(split_groups(model, ns_algorithm="standard", adjust_lr="match_rms_adamw"),
                            lr=0.05, weight_decay=0.1)
    reference = reference_of(optimizer, exact)
    for step in range(3):
        loss_step(model, optimizer, step)
        # NOTE: data parallel: the mean loss of every rank's identical batch is this one's.
        exact.zero_grad(set_to_none=True)
        exact(batch(step)).pow(2).mean().backward()
        reference.step()
    ours = {n.removeprefix("module."): whole_numpy(p) for n, p in model.named_parameters()}
    theirs = {n: whole_numpy(p) for n, p in exact.named_parameters()}
    local_rows = {n.removeprefix("module."): (p.to_local() if hasattr(p, "to_local") else p).shape[0]
                  for n, p in model.named_parameters()}
    return {"ours": ours, "theirs": theirs, "local_rows": local_rows}


def checkpoint_round_trip(rank: int, world: int, path: str) -> dict:
    """FSDP2: 2 steps, a DCP save, 2 more (the uninterrupted run); a fresh model and
    optimizer load the checkpoint and take the same 2 steps."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def fresh(lr: float):
        torch.manual_seed(0)
        model = wrap(SplitBlock(), "fsdp2", world)
        return model, dmuon.DMuon(split_groups(model, ns_algorithm="standard"), lr=lr, weight_decay=0.1)

    model, optimizer = fresh(0.05)
    for step in range(2):
        loss_step(model, optimizer, step)
    msd, osd = get_state_dict(model, optimizer)
    dmuon.checkpoint.save({"model": msd, "optim": osd}, path)
    shapes = {k: tuple(v.shape) for k, v in optimizer.state[model.qkv_proj.weight].items() if torch.is_tensor(v)}
    for step in range(2, 4):
        loss_step(model, optimizer, step)
    straight = {n: whole_numpy(p) for n, p in model.named_parameters()}
    dist.barrier()
    loaded, loaded_opt = fresh(0.5)
    msd, osd = get_state_dict(loaded, loaded_opt)
    state = {"model": msd, "optim": osd}
    dmuon.checkpoint.load(state, path)
    set_state_dict(loaded, loaded_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    groups = [(g.get("split_rows"), g.get("split_heads"), g["lr"]) for g in loaded_opt.param_groups]
    for step in range(2, 4):
        loss_step(loaded, loaded_opt, step)
    resumed = {n: whole_numpy(p) for n, p in loaded.named_parameters()}
    return {"straight": straight, "resumed": resumed, "groups": groups, "momentum_shapes": shapes,
            "param_shape": tuple(model.qkv_proj.weight.shape)}


def backward_step_matches_post_backward(rank: int, world: int, wrapper: str) -> dict:
    """3 steps with the step begun inside backward (column blocks included) and after it:
    per parameter ‖Δon − Δoff‖ / ‖Δoff‖, and the stages each step left during backward."""
    torch.manual_seed(0)
    base = SplitBlock()
    models, opts, initial = {}, {}, {}
    for on in (True, False):
        model = copy.deepcopy(base)
        initial[on] = wholes(model)
        models[on] = (wrap(model, "fsdp2", world) if wrapper == "fsdp2"
                      else nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=1e-4))
        opts[on] = dmuon.DMuon(split_groups(models[on], ns_algorithm="standard"), lr=0.05, weight_decay=0.1,
                               execution=dmuon.Execution(backward_step=on, bucket_size_mb=0.0005))
        opts[on].attach_backward_step(models[on])
    early = []
    for step in range(3):
        for on in (True, False):
            loss_step(models[on], opts[on], step)
        early.append(opts[True].runtime.last_stats.early_stages)
    return {"errors": update_errors(models[True], initial[True], models[False], initial[False]), "early": early}
