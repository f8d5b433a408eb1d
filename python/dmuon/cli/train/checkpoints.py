"""A training run's checkpoint through dmuon.checkpoint: model, optimizer, scheduler, data
generator, the step reached and the losses so far, so a resumed run continues bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from dmuon import checkpoint


def checkpoint_dir(out_dir: Path, optimizer_name: str) -> Path:
    """Where the run of `optimizer_name` keeps its latest checkpoint."""
    return out_dir / "checkpoints" / optimizer_name


def _state(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, generator: torch.Generator,
           progress: dict[str, Any]) -> dict[str, Any]:
    """Everything the run continues from (model and optimizer as get_state_dict gives them:
    sharded under FSDP2, whole under DDP and in one process)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
            "generator": generator.get_state(), "progress": progress}


def save_run(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             generator: torch.Generator, progress: dict[str, Any]) -> None:
    """Save the run after progress["step"] steps (collective over every rank)."""
    checkpoint.save(_state(model, optimizer, scheduler, generator, progress), directory)


def resume_run(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               generator: torch.Generator, progress: dict[str, Any]) -> dict[str, Any]:
    """Load the run's checkpoint into model, optimizer, scheduler and generator; returns the
    saved progress (`progress`: the fresh run's, same keys). No checkpoint: FileNotFoundError
    naming the path; a torn or incomplete one: dmuon.checkpoint.CheckpointError."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    if not checkpoint.found(directory):
        raise FileNotFoundError(f"resume: no checkpoint at {directory} (a run with --checkpoint-every N "
                                "and the same --out saves one)")
    state = _state(model, optimizer, scheduler, generator, progress)
    checkpoint.load(state, directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    return state["progress"]
