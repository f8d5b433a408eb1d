"""The published update rules of two other Muon implementations, written out plainly as the
oracles of `dmuon.presets` (torch.optim.Muon, the third, is importable and is its own oracle).
Like dmuon/reference.py (whose step loop and torch-style AdamW they reuse), these are for
reading, not speed, and share no code with the C++ core.

- Moonlight: "Muon is Scalable for LLM Training" (Liu et al., Moonshot AI, 2025), the
  reference optimizer of the MoonshotAI/Moonlight repository (examples/toy_train.py):
  SGD-style momentum ``B ← μ·B + G``, Nesterov ``G + μ·B``, the quintic Newton–Schulz with
  (3.4445, −4.7750, 2.0315) for 5 steps in bfloat16 on ``X / (‖X‖_F + 1e-7)``, the update
  scaled by ``0.2·√max(A, B)`` (A, B: the weight's first two dims) and decoupled weight decay
  ``W ← W·(1 − lr·wd)`` with the unscaled lr; its AdamW for the other parameters uses the
  same lr and weight decay, betas (0.9, 0.95) and eps 1e-8.
- Keller Jordan's Muon (KellerJordan/Muon repository, muon.py, 2024–2025;
  SingleDeviceMuonWithAuxAdam): EMA momentum ``B ← lerp(B, G, 1 − μ)`` (μ = 0.95), Nesterov
  ``lerp(G, B, μ)``, the same Newton–Schulz in bfloat16, the update scaled by
  ``√max(1, rows/cols)`` and ``W ← W·(1 − lr·wd)``; defaults lr 0.02, weight decay 0, and
  for the auxiliary Adam lr 3e-4, betas (0.9, 0.95), eps 1e-10, weight decay 0.

`ns_dtype` is the precision of the Newton–Schulz iteration: bfloat16 is each implementation's
own; float64 gives the exact update of the same rule.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dmuon.reference import ReferenceDMuon

QUINTIC = (3.4445, -4.7750, 2.0315)


def quintic_newton_schulz(G: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """X ← a·X + (b·A + c·A²)·X, A = X·Xᵀ, on the wide orientation, from X / (‖X‖_F + 1e-7)."""
    a, b, c = QUINTIC
    X = G.to(dtype)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.T if tall else X


class _PeerReference(ReferenceDMuon):
    """Muon groups and AdamW groups as dicts with "params" and "use_muon" plus the options;
    the step loop and torch-style AdamW (m̂/(√v̂ + eps), decoupled decay) are the reference's."""

    def __init__(self, groups: list[dict[str, Any]], ns_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(groups, ns_dtype)


class MoonlightReference(_PeerReference):
    """Moonlight's Muon (Liu et al., 2025). Muon group options: lr, weight_decay, momentum,
    nesterov, ns_steps; AdamW group options: lr, weight_decay, betas, eps."""

    def _muon(self, group: dict[str, Any], p: torch.Tensor, *view: Any) -> None:
        state = self.state.setdefault(id(p), {})
        g = p.grad.reshape(p.shape[0], -1)
        buf = state.setdefault("momentum_buffer", torch.zeros_like(g))
        buf.mul_(group["momentum"]).add_(g)
        u = g.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
        u = quintic_newton_schulz(u, group["ns_steps"], self.ns_dtype)
        lr = group["lr"]
        scaled = lr * 0.2 * math.sqrt(max(p.shape[0], p.shape[1]))
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(u.to(p.dtype).reshape(p.shape), alpha=-scaled)

    def _adamw(self, group: dict[str, Any], p: torch.Tensor) -> None:
        # NOTE: Moonlight's AdamW folds the bias corrections into one step size, eps outside
        # them: p ← p − lr·(√(1−β2ᵗ)/(1−β1ᵗ))·m/(eps + √v).
        state = self.state.setdefault(id(p), {})
        if "step" not in state:
            state.update(step=0, moment1=torch.zeros_like(p), moment2=torch.zeros_like(p))
        state["step"] += 1
        beta1, beta2 = group["betas"]
        t, lr, g = state["step"], group["lr"], p.grad
        state["moment1"].lerp_(g, 1 - beta1)
        state["moment2"].lerp_(g.square(), 1 - beta2)
        update = state["moment1"] / (group["eps"] + state["moment2"].sqrt())
        scale = (1 - beta1**t) / (1 - beta2**t) ** 0.5
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update, alpha=-lr / scale)


class KellerJordanReference(_PeerReference):
    """Keller Jordan's Muon with its auxiliary Adam (SingleDeviceMuonWithAuxAdam). Muon group
    options: lr, weight_decay, momentum (Nesterov always); AdamW: lr, weight_decay, betas, eps."""

    def _muon(self, group: dict[str, Any], p: torch.Tensor, *view: Any) -> None:
        state = self.state.setdefault(id(p), {})
        grad = p.grad.clone()
        buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
        beta = group["momentum"]
        buf.lerp_(grad, 1 - beta)
        update = grad.lerp_(buf, beta)
        matrix = update.reshape(len(update), -1) if update.ndim == 4 else update
        out = quintic_newton_schulz(matrix, 5, self.ns_dtype)
        out = out * max(1, grad.size(-2) / grad.size(-1)) ** 0.5
        lr = group["lr"]
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(out.to(p.dtype).reshape(p.shape), alpha=-lr)
