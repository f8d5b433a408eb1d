"""The optimizers `python -m dmuon bench e2e` compares, by name.

Each entry builds its optimizer on the FSDP2-sharded model; an entry may also `prepare` the
unsharded model first: prepare(model, mesh, settings) runs before fully_shard and returns
extra keyword arguments for every fully_shard call (or None), as the weight-ownership
mode does (dmuon.own_matrices, then FSDP2 shards everything else); its key "owned", not
passed on, holds the dmuon.OwnedMatrices it made (the benchmark reads its timeline).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What every optimizer is built with (the figures are times: the values only need to
    be sane, and are the same for every run)."""

    lr: float = 0.02  # Muon (match_rms_adamw scale)
    adamw_lr: float = 3e-4  # AdamW, and DMuon's AdamW parameters
    weight_decay: float = 0.1
    device_type: str = "cuda"
    backward_step: bool | None = None  # DMuon's Execution.backward_step (None: the default, off)
    bucket_size_mb: float | None = None  # DMuon's Execution.bucket_size_mb (None: its default)
    record_timeline: bool = False  # DMuon's Execution.record_timeline (the fake world's projection reads it)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerEntry:
    description: str
    build: Callable[[nn.Module, Settings], torch.optim.Optimizer]
    # (unsharded model, device mesh, settings) -> extra fully_shard keyword arguments (and "owned") or None
    prepare: Callable[[nn.Module, Any, Settings], dict[str, Any] | None] | None = None


def _dmuon(mode: str, backward_step: bool | None = None) -> Callable[[nn.Module, Settings], torch.optim.Optimizer]:
    """backward_step: fixed for this entry (None: the settings')."""
    def build(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
        import dmuon

        return dmuon.DMuon(model, lr=s.lr, weight_decay=s.weight_decay, adamw_lr=s.adamw_lr,
                           execution=dmuon.Execution(mode=mode,
                                                     backward_step=s.backward_step if backward_step is None
                                                     else backward_step,
                                                     record_timeline=s.record_timeline,
                                                     **({} if s.bucket_size_mb is None
                                                        else {"bucket_size_mb": s.bucket_size_mb})))

    return build


def _adamw(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    # NOTE: fused: torch's fastest AdamW, the baseline the overhead target is measured against.
    return torch.optim.AdamW(model.parameters(), lr=s.adamw_lr, weight_decay=s.weight_decay, fused=True)


def _own_matrices(model: nn.Module, mesh: Any, s: Settings) -> dict[str, Any]:
    import dmuon

    # NOTE: bf16 compute copies match FSDP2's bf16 parameters; gradients reduce in float32
    # like FSDP2's reduce_dtype.
    owned = dmuon.own_matrices(model, mesh, param_dtype=torch.bfloat16 if s.device_type == "cuda" else None)
    return {"ignored_params": owned.params, "owned": owned}


OPTIMIZERS: dict[str, OptimizerEntry] = {
    "dmuon-ownership": OptimizerEntry(
        description="DMuon, weight-ownership mode (dmuon.own_matrices before fully_shard)",
        prepare=_own_matrices, build=_dmuon("owner")),
    "dmuon": OptimizerEntry(description="DMuon, owner mode (sharded matrices, each orthogonalized once)",
                            build=_dmuon("owner")),
    # NOTE: beside "dmuon" (--backward-step off) in one run, the step begun from backward is
    # compared with the one after it in turns: the fake rank's forward + backward moves by up
    # to 15% between runs, more than the difference measured.
    "dmuon-backward": OptimizerEntry(
        description="DMuon, owner mode, the step begun from backward (Execution.backward_step=True)",
        build=_dmuon("owner", backward_step=True)),
    "gather": OptimizerEntry(description="DMuon, gather mode (every rank gathers and orthogonalizes every matrix)",
                             build=_dmuon("gather")),
    "adamw": OptimizerEntry(description="torch.optim.AdamW(fused=True) on every parameter", build=_adamw),
}

# The probe that sizes the micro-batch: AdamW keeps the most state per parameter (two
# float32 moments; DMuon keeps one momentum for matrices and AdamW's two for the rest).
PROBE_OPTIMIZER = "adamw"


def parse_optimizers(text: str) -> list[str]:
    """`--optimizers a,b,c` → names, each known, none twice."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"--optimizers must name at least one of {', '.join(OPTIMIZERS)}, got {text!r}")
    unknown = [name for name in names if name not in OPTIMIZERS]
    if unknown:
        raise ValueError(f"--optimizers: unknown {unknown}; known: {', '.join(OPTIMIZERS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--optimizers lists a name twice: {text!r}")
    return names
