"""Shared by the Newton–Schulz tests: the default schedule as op arguments, the plain
reference over a batch of matrices, and the relative Frobenius error."""

from __future__ import annotations

import torch

from dmuon import _C
from dmuon.reference import default_coefficients, default_restarts, newton_schulz_gram, newton_schulz_standard


def schedule(algorithm: str, steps: int = 5) -> tuple[list[float], list[int]]:
    """(flattened coefficients, restart iterations) of the algorithm's default schedule."""
    coefficients, restarts = _C.default_schedule(algorithm, steps)
    return [x for c in coefficients for x in c], list(restarts)


def reference(x: torch.Tensor, algorithm: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """reference.py's NS of every matrix of x [..., m, n], iterated in `dtype`."""
    outs = []
    for G in x.reshape(-1, *x.shape[-2:]):
        if algorithm == "gram":
            outs.append(newton_schulz_gram(G, default_coefficients("gram", 5), default_restarts("gram", 5), 1e-7, dtype))
        else:
            outs.append(newton_schulz_standard(G, default_coefficients("standard", 5), 1e-7, dtype))
    return torch.stack(outs).reshape(x.shape)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖_F / ‖b‖_F in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm())
