"""Optimizers by name, and the LR schedule they share."""

from __future__ import annotations

import math

import torch
from torch import nn

from dmuon.cli.train.config import OPTIMIZER_NAMES, TrainConfig


def muon_param_names(model: nn.Module) -> list[str]:
    """Names of the parameters Muon owns: 2-D nn.Linear weights except `lm_head`'s.

    NOTE: this mirrors dmuon.DMuon's documented auto-routing; everything else (embeddings,
    LayerNorms, lm_head, biases) is AdamW's.
    """
    names = []
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module_name.split(".")[-1] != "lm_head":
            names.append(f"{module_name}.weight" if module_name else "weight")
    return names


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on the hidden matrices plus torch.optim.AdamW on the rest, as one optimizer.

    NOTE: a reference for dmuon (same routing, same lr scale), so LambdaLR sees one optimizer
    whose param_groups are the two inner optimizers' own group dicts.
    """

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        # NOTE: Optimizer.__init__ is not called: the inner optimizers own the params and state.
        self.inner = (muon, adamw)
        self.defaults = {}
        self.param_groups = muon.param_groups + adamw.param_groups

    @property
    def state(self):  # type: ignore[override]
        return {**self.inner[0].state, **self.inner[1].state}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.inner:
            optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("closure: MuonWithAdamW.step does not take a closure")
        for optimizer in self.inner:
            optimizer.step()


def build_optimizer(name: str, model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer `name` ("dmuon" | "adamw" | "torch-muon") over `model`'s parameters.

    Muon matrices use config.lr; parameters trained by AdamW use config.adamw_lr in every run,
    so the dmuon and AdamW runs differ only in how the hidden matrices are updated.
    """
    beta1, beta2 = config.betas
    if name == "adamw":
        return torch.optim.AdamW(
            model.parameters(), lr=config.adamw_lr, betas=(beta1, beta2),
            weight_decay=config.weight_decay,
        )
    if name == "dmuon":
        import dmuon

        return dmuon.DMuon(
            model, lr=config.lr, weight_decay=config.weight_decay,
            adamw_lr=config.adamw_lr, adamw_betas=(beta1, beta2),
            adamw_weight_decay=config.weight_decay,
        )
    if name == "torch-muon":
        muon_names = set(muon_param_names(model))
        named = list(model.named_parameters())
        muon = torch.optim.Muon(
            [p for n, p in named if n in muon_names], lr=config.lr,
            weight_decay=config.weight_decay, adjust_lr_fn="match_rms_adamw",
        )
        adamw = torch.optim.AdamW(
            [p for n, p in named if n not in muon_names], lr=config.adamw_lr,
            betas=(beta1, beta2), weight_decay=config.weight_decay,
        )
        return MuonWithAdamW(muon, adamw)
    raise ValueError(f"name: unknown optimizer {name!r}; known: {OPTIMIZER_NAMES}")


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to min_lr_ratio at total_steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """The shared schedule: every param group's lr times lr_multiplier(step)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step, total_steps=config.steps, warmup_steps=config.warmup_steps,
            min_lr_ratio=config.min_lr_ratio,
        ),
    )
