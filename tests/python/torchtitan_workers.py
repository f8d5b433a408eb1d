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


# torchtitan's Trainer (torch newer than 2.11) on its llama3 debug model, CPU processes over Gloo.
TRAINER_STEPS, CHECKPOINT_STEP = 6, 3


def write_trainer_assets(root: str) -> None:
    """What the debug model's config reads from torchtitan's repository (not in its wheel),
    made here: a byte-level tokenizer (256 tokens, no merges) and a JSON-lines text dataset."""
    import json
    import os

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    for folder in ("tokenizer", "data"):
        os.makedirs(f"{root}/{folder}")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={symbol: i for i, symbol in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(f"{root}/tokenizer/tokenizer.json")
    words = ["alpha", "beta", "gamma", "delta", "the", "fox", "jumps", "over", "a", "lazy", "dog"]
    generator = torch.Generator().manual_seed(0)
    with open(f"{root}/data/data.json", "w") as f:
        for _ in range(200):
            picks = torch.randint(len(words), (40,), generator=generator).tolist()
            f.write(json.dumps({"text": " ".join(words[i] for i in picks)}) + "\n")


def _trainer_on_cpu() -> None:
    """Points torchtitan's device choice at the CPU. NOTE: torchtitan.tools.utils takes
    `_get_available_device_type() or "cuda"` when imported, and its modules copy it: without an
    accelerator the Trainer calls torch.cuda.set_device. torchtitan's own unit tests patch
    device_type to "cpu" the same way. Its memory monitor reads get_device_name,
    get_device_properties, memory_stats, reset_peak_memory_stats and empty_cache, which torch.cpu
    lacks (stand-ins report nothing), and its barrier takes current_device() as an index (torch.cpu
    returns "cpu")."""
    import sys
    import types

    import torchtitan.trainer  # noqa: F401  (every module that copies the device choice)

    cpu = types.SimpleNamespace(
        set_device=torch.cpu.set_device, device_count=torch.cpu.device_count, synchronize=torch.cpu.synchronize,
        is_available=torch.cpu.is_available, current_device=lambda: 0, get_device_name=lambda *_: "cpu",
        get_device_properties=lambda *_: types.SimpleNamespace(total_memory=1 << 30),
        memory_stats=lambda *_: {}, reset_peak_memory_stats=lambda *_: None, empty_cache=lambda: None)
    for name, module in list(sys.modules.items()):
        if name.startswith("torchtitan"):
            if getattr(module, "device_type", None) == "cuda":
                module.device_type = "cpu"
            if getattr(module, "device_module", None) is torch.cuda:
                module.device_module = cpu


def train_debug_model(rank: int, world: int, root: str, run: str, resume_from: str | None) -> dict:
    """torchtitan's llama3_debugmodel config with the README's DMuon line, trained by its Trainer
    for TRAINER_STEPS under FSDP2 (checkpoints every CHECKPOINT_STEP steps in root/run); with
    resume_from, the Trainer resumes from that run's step-CHECKPOINT_STEP checkpoint. Returns the
    logged losses by step and (rank 0) the whole parameters."""
    import shutil

    _trainer_on_cpu()
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    from torchtitan.trainer import Trainer

    config = llama3_debugmodel()
    config.optimizer = dmuon_optimizers(lr=0.02, weight_decay=0.1, adamw_lr=3e-3)
    # NOTE: the debug model's attention is FlexAttention, which in torch 2.15 raises "does not
    # support backward on CPU" (its other backend, varlen, is CUDA flash attention); torchtitan's
    # graph-trainer tests swap in SDPA the same way: the same parameters, causal over the whole
    # sequence instead of per document.
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    config.hf_assets_path, config.dump_folder = f"{root}/tokenizer", f"{root}/{run}"
    config.dataloader = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=f"{root}/data")
    config.training.local_batch_size, config.training.seq_len = 2, 64
    config.training.steps = TRAINER_STEPS
    config.debug.seed, config.validator.enable = 0, False
    config.checkpoint.enable, config.checkpoint.interval = True, CHECKPOINT_STEP
    if resume_from and rank == 0:
        shutil.copytree(f"{root}/{resume_from}/checkpoint/step-{CHECKPOINT_STEP}",
                        f"{root}/{run}/checkpoint/step-{CHECKPOINT_STEP}")
    dist.barrier()

    trainer = Trainer(config)
    # NOTE: torchtitan divides gradients by the global token count itself and sets FSDP's divide
    # factor to 1, so FSDP reduce-scatters with ReduceOp.PREMUL_SUM(1.0), which Gloo refuses
    # ("Cannot use ReduceOp.PREMUL_SUM with Gloo"); forced to SUM, the same sum is sent.
    for module in trainer.model_parts[0].modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    losses: dict[int, float] = {}
    log = trainer.metrics_processor.log

    def record(step: int, loss: float, *args, **kwargs):
        losses[step] = loss
        return log(step, loss, *args, **kwargs)

    trainer.metrics_processor.log = record
    trainer.train()
    params = _full(trainer.model_parts[0])
    optimizers = [type(o).__name__ for o in trainer.optimizers.optimizers]
    trainer.close()
    # NOTE: numpy arrays: tensors would go back through shared memory a finished rank no longer holds.
    return {"losses": losses, "optimizers": optimizers,
            "params": {n: t.numpy() for n, t in params.items()} if rank == 0 else None}
