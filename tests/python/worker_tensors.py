"""What the distributed test workers share: a tensor's whole value on this rank, and the
plain-loop reference: its groups with DMuon's defaults, or an optimizer's own groups over a
copy of the model."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from dmuon.reference import ReferenceDMuon


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a DTensor's gathered from every rank), detached, a copy of its own."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def whole_numpy(t: torch.Tensor) -> np.ndarray:
    """whole(t) in float64 on the host (results travel between processes by value)."""
    return whole(t).cpu().double().numpy()


def default_reference_groups(muon: list, adamw: list, options: dict) -> list[dict]:
    """DMuon's defaults with `options`' lr, weight_decay and ns_algorithm as ReferenceDMuon
    groups: the parameters `muon` stepped by Muon, `adamw` by AdamW."""
    lr, weight_decay = options["lr"], options["weight_decay"]
    return [dict(use_muon=True, lr=lr, weight_decay=weight_decay, momentum=0.95, nesterov=True,
                 ns_algorithm=options["ns_algorithm"], ns_coefficients=None, ns_steps=5, eps=1e-7,
                 adjust_lr="match_rms_adamw", params=muon),
            dict(use_muon=False, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8, params=adamw)]


def reference_of(optimizer, model_copy: nn.Module) -> ReferenceDMuon:
    """The plain-loop reference on `model_copy`, with `optimizer`'s groups (split options too);
    parameters matched by name, DDP's "module." prefix left out."""
    by_name = {n.removeprefix("module."): p for n, p in model_copy.named_parameters()}
    return ReferenceDMuon([{**{k: copy.deepcopy(v) for k, v in g.items() if k != "params"},
                            "params": [by_name[optimizer.param_name(p).removeprefix("module.")] for p in g["params"]]}
                           for g in optimizer.param_groups])
