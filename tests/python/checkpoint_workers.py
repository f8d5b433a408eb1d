"""Workers for the checkpoint tests: train a small model under FSDP2, DDP or on one
process, save or load through dmuon.checkpoint (torch.distributed.checkpoint into a directory
swapped in whole), and continue training."""

from __future__ import annotations

import torch
from torch import nn

import dmuon
import dmuon.checkpoint
from worker_tensors import whole_numpy


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 16),
                         nn.LayerNorm(16), nn.Linear(16, 10, bias=False))


def wrap(model: nn.Module, wrapper: str, world: int) -> nn.Module:
    """FSDP2 on every layer with parameters, DDP, or nothing ("none")."""
    if wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if wrapper == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    return model


def train(model: nn.Module, opt: torch.optim.Optimizer, first_step: int, num_steps: int) -> None:
    """The same global batches at every world size (data parallel: the mean loss)."""
    for step in range(first_step, first_step + num_steps):
        tokens = torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(tokens).pow(2).mean().backward()
        opt.step()


def snapshot(model: nn.Module, opt: torch.optim.Optimizer | None = None) -> dict:
    """This rank's view, whole (numpy: results travel between processes by value): every
    parameter ("params"), and with `opt` every state entry of every parameter ("state",
    by parameter and key) and the param groups' options ("groups")."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    out = {"params": {name.removeprefix("module."): whole_numpy(p) for name, p in model.named_parameters()}}
    if opt is not None:
        _, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
        out["state"] = {f"{str(fqn).removeprefix('module.')}.{key}": whole_numpy(value) if torch.is_tensor(value) else value
                        for fqn, entries in osd["state"].items() for key, value in entries.items()}
        # NOTE: a full state dict's load gives tuples back as lists (betas): compared as lists.
        out["groups"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items() if k != "params"}
                         for g in osd["param_groups"]]
    return out


def _state(model, opt, full: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=full, cpu_offload=full)
    return get_state_dict(model, opt, options=options)


def save_then_continue(rank: int, world: int, wrapper: str, path: str, full: bool = False,
                       extra: dict | None = None) -> dict:
    """3 steps, checkpoint, 3 more steps: the uninterrupted trajectory. `extra`: more DMuon
    options (e.g. normuon=True; the load takes them from the checkpoint)."""
    model = wrap(make_model(), wrapper, world)
    opt = dmuon.DMuon(model, lr=0.02, weight_decay=0.1, **(extra or {}))
    train(model, opt, 0, 3)
    msd, osd = _state(model, opt, full)
    if full:
        if rank == 0:
            torch.save({"model": msd, "optim": osd}, path)
    else:
        dmuon.checkpoint.save({"model": msd, "optim": osd}, path)
    train(model, opt, 3, 3)
    return snapshot(model, opt)


def load_then_continue(rank: int, world: int, wrapper: str, path: str, full: bool = False,
                       extra: dict | None = None) -> dict:
    """A fresh model and optimizer, the checkpoint loaded, 3 more steps. `extra`: options the
    optimizer is made with. NOTE: DCP loads the state keys the fresh optimizer's state dict
    has (torch initializes it by a zero step), so an option that adds state (normuon) must be
    given, as a training script would; lr and weight decay come from the checkpoint."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    model = wrap(make_model(), wrapper, world)
    opt = dmuon.DMuon(model, lr=0.5, weight_decay=0.0, **(extra or {}))  # options come back from the checkpoint
    if full:
        state = torch.load(path, weights_only=False)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(full_state_dict=True))
    else:
        msd, osd = _state(model, opt, False)
        state = {"model": msd, "optim": osd}
        dmuon.checkpoint.load(state, path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert opt.param_groups[0]["lr"] == 0.02 and opt.param_groups[0]["weight_decay"] == 0.1
    dist.barrier()
    train(model, opt, 3, 3)
    return snapshot(model, opt)
