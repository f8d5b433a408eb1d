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


def wholes(model: nn.Module) -> dict[str, torch.Tensor]:
    """whole() of every parameter of `model` on the host, by name (DDP's "module." prefix left out)."""
    return {n.removeprefix("module."): whole(p).cpu() for n, p in model.named_parameters()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (an all-zero b counts as 1e-30)."""
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def update_errors(model: nn.Module, initial: dict, reference: nn.Module, reference_initial: dict) -> dict[str, float]:
    """Per parameter (by name): rel(Δ, Δref) of `model`'s change since `initial` against
    `reference`'s since `reference_initial` (both wholes() of the models as they started)."""
    now, ref = wholes(model), wholes(reference)
    return {n: rel(now[n] - initial[n], ref[n] - reference_initial[n]) for n in now}


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


def reference_of(optimizer, model_copy: nn.Module | list, ns_dtype: torch.dtype = torch.float64) -> ReferenceDMuon:
    """The plain-loop reference (Newton–Schulz in `ns_dtype`) with `optimizer`'s groups (split
    options too) on `model_copy`: a copy of its model (parameters matched by name, DDP's
    "module." prefix left out) or its parameters' copies in the optimizer's order; each Muon
    matrix viewed as the optimizer views it (a stack, row blocks, transposed)."""
    if isinstance(model_copy, nn.Module):
        by_name = {n.removeprefix("module."): p for n, p in model_copy.named_parameters()}
        copy_of = lambda p: by_name[optimizer.param_name(p).removeprefix("module.")]  # noqa: E731
    else:
        by_id = dict(zip((id(p) for g in optimizer.param_groups for p in g["params"]), model_copy))
        copy_of = lambda p: by_id[id(p)]  # noqa: E731
    groups = []
    for g in optimizer.param_groups:
        groups.append({**{k: copy.deepcopy(v) for k, v in g.items() if k not in ("params", "param_names")},
                       "params": [copy_of(p) for p in g["params"]]})
        if g["use_muon"]:
            views = [optimizer.matrix_view(p) for p in g["params"]]
            groups[-1].update(batch_dims=[v.batch_dims for v in views], row_blocks=[v.row_blocks for v in views],
                              transposed=[v.transposed for v in views])
    return ReferenceDMuon(groups, ns_dtype=ns_dtype)
