"""Workers of test_integration_torchtitan (spawned Gloo ranks): torchtitan's optimizer and
lr-scheduler containers with DMuon on a model under FSDP2, its clipping, DCP checkpoints."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import framework_models
from dmuon.integrations.torchtitan import dmuon_optimizers


def _parts(world: int):
    """A fresh model (same values on every call) under FSDP2, its container and schedulers."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.optimizer import LRSchedulersContainer

    torch.manual_seed(0)
    model = framework_models.TinyLM()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizers = dmuon_optimizers(lr=0.02, weight_decay=0.1, adamw_lr=3e-3).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2, decay_type="cosine").build(optimizers=optimizers,
                                                                                       training_steps=8)
    return model, optimizers, schedulers


def _train(model, optimizers, schedulers, steps, rank: int) -> list[float]:
    from torchtitan.distributed.utils import clip_grad_norm_

    norms = []
    for step in steps:
        model.loss(framework_models.batch(step, rank)).backward()
        norms.append(float(clip_grad_norm_(list(model.parameters()), max_norm=0.5)))
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
    return norms


def _full(model) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def checkpoint_round_trip(rank: int, world: int, directory: str) -> dict:
    """Train 3 steps, save (DCP), train 3 more; a fresh model loads the checkpoint and trains
    the same 3: both end equal. The state made before a first step moves no counter."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model, optimizers, schedulers = _parts(world)
    (dmuon_opt,) = optimizers.optimizers
    lrs = [(g["use_muon"], g["initial_lr"]) for g in dmuon_opt.param_groups]
    before = {n: t.clone() for n, t in _full(model).items()}
    flat = optimizers.state_dict()  # the state made without a step
    unchanged = all(torch.equal(before[n], t) for n, t in _full(model).items())
    counters = sorted({(k.rsplit(".", 1)[1], float(v)) for k, v in flat.items()
                       if k.endswith((".step", ".num_steps", ".num_skipped_steps"))})
    _train(model, optimizers, schedulers, range(3), rank)
    dcp.save({"model": get_model_state_dict(model), "optimizer": optimizers, "lr_scheduler": schedulers},
             checkpoint_id=directory)
    norms = _train(model, optimizers, schedulers, range(3, 6), rank)
    whole = _full(model)

    model, optimizers, schedulers = _parts(world)
    state = {"model": get_model_state_dict(model), "optimizer": optimizers, "lr_scheduler": schedulers}
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    resumed_norms = _train(model, optimizers, schedulers, range(3, 6), rank)
    resumed = _full(model)
    dist.barrier()
    return {"lrs": lrs, "unchanged": unchanged, "counters": counters, "norms": norms, "resumed_norms": resumed_norms,
            "equal": all(torch.equal(whole[n], resumed[n]) for n in whole),
            "keys": sorted(k for k in flat if k.startswith("state.layers.0.wq")),
            "last_lr": schedulers.schedulers[0].get_last_lr()}


def state_made_on_one_rank_alone(rank: int, world: int) -> dict:
    """Rank 0 alone asks for the state before the first step (a checkpoint of one rank): no
    rank blocks, and the training that follows is that of a run that never asked."""
    results = []
    for ask in (False, True):
        model, optimizers, schedulers = _parts(world)
        if ask and rank == 0:
            optimizers.state_dict()
        _train(model, optimizers, schedulers, range(2), rank)
        results.append(_full(model))
    return {"equal": all(torch.equal(results[0][n], results[1][n]) for n in results[0])}
