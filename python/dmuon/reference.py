"""A plain, pure-PyTorch implementation of DMuon's update rule: the test oracle.

Everything here is written for reading, not speed: one parameter at a time, the
Newton–Schulz iterations spelled out, float64 by default. It shares no code with the C++
core (its coefficient tables are typed in again on purpose).
"""

from __future__ import annotations

import math
from typing import Any

import torch

# Keller Jordan's quintic (torch.optim.Muon's default).
KELLER_JORDAN = (3.4445, -4.7750, 2.0315)

# Polar Express, 5 steps, unscaled (Amsel et al., 2025).
POLAR_EXPRESS = [
    (8.28721, -23.59589, 17.30039),
    (4.10706, -2.94785, 0.54484),
    (3.94869, -2.90890, 0.55182),
    (3.31842, -2.48849, 0.51005),
    (2.30065, -1.66890, 0.41881),
]


def polar_express_coefficients(num_steps: int, safety: float = 1.05) -> list[tuple[float, float, float]]:
    """Each step's p(x) becomes p(x/s): (a/s, b/s³, c/s⁵); steps past 5 repeat the last."""
    steps = []
    for i in range(num_steps):
        a, b, c = POLAR_EXPRESS[min(i, len(POLAR_EXPRESS) - 1)]
        steps.append((a / safety, b / safety**3, c / safety**5))
    return steps


def default_coefficients(algorithm: str, num_steps: int) -> list[tuple[float, float, float]]:
    if algorithm == "gram":
        return polar_express_coefficients(num_steps)
    return [KELLER_JORDAN] * num_steps


def default_restarts(algorithm: str, num_steps: int) -> list[int]:
    return [2] if algorithm == "gram" and num_steps > 2 else []


def newton_schulz_standard(G: torch.Tensor, coefficients, eps: float, dtype=torch.float64) -> torch.Tensor:
    """X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ, on the wide orientation of G."""
    X = G.to(dtype)
    transposed = X.shape[0] > X.shape[1]
    if transposed:
        X = X.T
    X = X / X.norm().clamp(min=eps)
    for a, b, c in coefficients:
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if transposed:
        X = X.T
    return X


def newton_schulz_gram(G: torch.Tensor, coefficients, restarts, eps: float, dtype=torch.float64) -> torch.Tensor:
    """The same polynomial accumulated in the Gram space: X_k = Q_k·X_0."""
    X = G.to(dtype)
    transposed = X.shape[0] > X.shape[1]
    if transposed:
        X = X.T
    X = X / X.norm().clamp(min=eps)
    m = X.shape[0]
    I = torch.eye(m, dtype=dtype, device=X.device)
    R = X @ X.T
    Q = I.clone()
    for step, (a, b, c) in enumerate(coefficients, start=1):
        Z = b * R + c * (R @ R)
        P = a * I + Z           # this step's polynomial in the current Gram matrix
        Q = P @ Q
        if step in restarts and step < len(coefficients):
            X = Q @ X           # restart: materialize the iterate and rebuild R
            R = X @ X.T
            Q = I.clone()
        else:
            R = P @ R @ P
    X = Q @ X
    if transposed:
        X = X.T
    return X


def adjusted_lr_ratio(adjust_lr: str | None, rows: int, cols: int) -> float:
    if adjust_lr is None:
        return 1.0
    if adjust_lr == "original":
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr == "spectral":
        return math.sqrt(rows / cols)
    raise ValueError(f"unknown adjust_lr {adjust_lr!r}")


def normuon_update(O: torch.Tensor, v: torch.Tensor, beta2: float, eps: float) -> torch.Tensor:
    """NorMuon (Li et al., 2025) on one orthogonalized update O [rows, cols] as stored in the
    parameter, with its per-row second moment v (float32 [rows], updated in place):
    v_i ← β₂·v_i + (1 − β₂)·mean_j O_ij², Ô_i = O_i / (√v_i + ε), then Ô scaled to ‖O‖_F.
    Sums in float64, one row at a time."""
    rows, cols = O.shape
    O = O.to(torch.float64)
    row_sq = [float((O[i] * O[i]).sum()) for i in range(rows)]
    norm_sq = sum(row_sq)
    divisor = []
    for i in range(rows):
        v[i] = beta2 * float(v[i]) + (1.0 - beta2) * row_sq[i] / cols  # rounded to v's float32
        divisor.append(math.sqrt(float(v[i])) + eps)
    hat_sq = sum(row_sq[i] / divisor[i] ** 2 for i in range(rows))
    if hat_sq == 0.0:
        return O
    keep = math.sqrt(norm_sq / hat_sq)
    return torch.stack([O[i] * (keep / divisor[i]) for i in range(rows)])


def as_matrices(t: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """[B, m, n]: a stack for batch_dims=1, else one matrix with trailing dims flattened."""
    if batch_dims == 1:
        return t.reshape(t.shape[0], t.shape[1], -1)
    return t.reshape(1, t.shape[0], -1)


def matrix_blocks(t: torch.Tensor, batch_dims: int, row_blocks, col_blocks: int = 0) -> list[torch.Tensor]:
    """The matrices Muon orthogonalizes, as views of `t` (contiguous): the stack's or the one
    matrix's, or the row blocks of dim 0 (of each matrix of a stack) when given, or `col_blocks` > 1 equal blocks of the
    columns of a 2-D `t` (strided views)."""
    if col_blocks > 1:
        return list(t.split(t.shape[1] // col_blocks, dim=1))
    if row_blocks and batch_dims == 1:
        return [block for m in as_matrices(t, 1) for block in m.split(list(row_blocks), dim=0)]
    if row_blocks:
        return list(t.reshape(t.shape[0], -1).split(list(row_blocks), dim=0))
    return list(as_matrices(t, batch_dims))


def split_row_blocks(group: dict[str, Any], p: torch.Tensor, row_blocks=()) -> tuple[int, ...]:
    """The row blocks a group's split orthogonalization gives `p`: split_rows as
    given, split_heads as equal blocks of dim 0; else `row_blocks`. Plain checks, no routing."""
    if group.get("split_rows") is not None:
        sizes = tuple(int(s) for s in group["split_rows"])
        assert sum(sizes) == p.shape[0], f"split_rows {sizes} does not sum to {p.shape[0]} rows"
        return sizes
    if group.get("split_heads") is not None:
        heads = int(group["split_heads"])
        assert p.shape[0] % heads == 0, f"{p.shape[0]} rows do not split into {heads} heads"
        return (p.shape[0] // heads,) * heads
    return tuple(row_blocks)


def split_col_blocks(group: dict[str, Any], p: torch.Tensor) -> int:
    """The equal column blocks of split_heads=n with split_dim=1 (0: none). Plain checks."""
    if group.get("split_dim") != 1 or group.get("split_heads") is None:
        return 0
    heads = int(group["split_heads"])
    assert p.dim() == 2 and p.shape[1] % heads == 0, f"{tuple(p.shape)} does not split into {heads} column heads"
    return heads


class ReferenceDMuon:
    """Pure-PyTorch DMuon. `groups`: dicts like DMuon.param_groups (all options filled),
    plus optional per-parameter lists: "batch_dims" (default: 1 for 3-D, else 0),
    "row_blocks" (rows of each block orthogonalized on its own; default none) and
    "transposed" (the matrix is stored (in, out): the lr adjustment takes (cols, rows)). A
    group's "split_rows" / "split_heads" (split orthogonalization) replace the row blocks: each
    block is orthogonalized and lr-adjusted on its own, in place in the parameter's rows; with
    "split_dim": 1, split_heads cuts equal blocks of columns instead."""

    def __init__(self, groups: list[dict[str, Any]], ns_dtype: torch.dtype = torch.float64) -> None:
        self.groups = groups
        self.ns_dtype = ns_dtype
        self.state: dict[int, dict[str, Any]] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.groups:
            batch_dims = group.get("batch_dims") or [1 if p.dim() == 3 else 0 for p in group["params"]]
            row_blocks = group.get("row_blocks") or [()] * len(group["params"])
            transposed = group.get("transposed") or [False] * len(group["params"])
            for p, bdims, blocks, flipped in zip(group["params"], batch_dims, row_blocks, transposed):
                if p.grad is None:
                    continue
                if group["use_muon"]:
                    cols = split_col_blocks(group, p)
                    self._muon(group, p, bdims, () if cols else split_row_blocks(group, p, blocks), flipped, cols)
                else:
                    self._adamw(group, p)

    def _muon(self, group: dict[str, Any], p: torch.Tensor, batch_dims: int, row_blocks=(),
              transposed: bool = False, col_blocks: int = 0) -> None:
        state = self.state.setdefault(id(p), {})
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        normuon = group.get("normuon", False)
        if normuon and "normuon_v" not in state:
            state["normuon_v"] = torch.zeros(p.shape[:1 + batch_dims], dtype=torch.float32, device=p.device)
        buf, grad, mu = state["momentum_buffer"], p.grad, group["momentum"]
        buf.lerp_(grad, 1 - mu)                                    # buf ← μ·buf + (1−μ)·G
        update = grad.lerp(buf, mu) if group["nesterov"] else buf  # (1−μ)·G + μ·buf
        if p.numel() == 0:
            return
        algorithm, steps = group["ns_algorithm"], group["ns_steps"]
        coefficients = group["ns_coefficients"] or default_coefficients(algorithm, steps)
        if len(coefficients) == 1:
            coefficients = list(coefficients) * steps
        lr = group["lr"]
        p.mul_(1 - lr * group["weight_decay"])
        assert p.is_contiguous(), "the reference updates its parameters through views of their matrices"
        targets = matrix_blocks(p, batch_dims, row_blocks, col_blocks)
        # NorMuon's v of each matrix (rows as stored): views of the state, like the targets'.
        # (Column blocks with NorMuon are refused by DMuon: their rows are not the state's.)
        v_rows: list[Any] = [None] * len(targets)
        if normuon:
            assert col_blocks <= 1, "NorMuon with column blocks (split_dim=1) is not defined here"
            flat_v = state["normuon_v"].reshape(-1)
            v_rows = list(flat_v.split(list(row_blocks))) if row_blocks else list(flat_v.reshape(len(targets), -1))
        for G, target, v in zip(matrix_blocks(update, batch_dims, row_blocks, col_blocks), targets, v_rows):
            # NOTE: a transposed matrix is orthogonalized as the model uses it, Gᵀ.
            M = G.T if transposed else G
            if algorithm == "gram":
                restarts = group.get("ns_restarts")
                restarts = default_restarts(algorithm, steps) if restarts is None else restarts
                O = newton_schulz_gram(M, coefficients, restarts, group["eps"], self.ns_dtype)
            else:
                O = newton_schulz_standard(M, coefficients, group["eps"], self.ns_dtype)
            rows, cols = M.shape
            # NOTE: contiguous, as DMuon applies it: Newton–Schulz returns a tall matrix as a
            # transposed view, and torch's add_ of a strided bf16 operand rounds differently at
            # bf16 rounding boundaries (18 of 576 elements of a 48x12 bf16 weight, one ulp).
            O = (O.T if transposed else O).contiguous()
            if normuon:
                O = normuon_update(O, v.reshape(-1), group["normuon_beta2"], group["normuon_eps"])
            target.add_(O.to(p.dtype), alpha=-lr * adjusted_lr_ratio(group["adjust_lr"], rows, cols))

    def _adamw(self, group: dict[str, Any], p: torch.Tensor) -> None:
        state = self.state.setdefault(id(p), {})
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        lr, eps, grad = group["lr"], group["eps"], p.grad
        state["step"] += 1
        t = state["step"]
        p.mul_(1 - lr * group["weight_decay"])
        state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m_hat = state["exp_avg"] / (1 - beta1**t)
        v_hat = state["exp_avg_sq"] / (1 - beta2**t)
        p.sub_(lr * m_hat / (v_hat.sqrt() + eps))


def qk_clip_reference(w_q: torch.Tensor, w_k: torch.Tensor, max_logits, tau: float, num_heads: int,
                      num_kv_heads: int, head_dim: int) -> None:
    """MuonClip's QK-clip (Kimi Team, 2025) in place, one head at a time: γ_h = min(1, τ/S_h);
    multi-head: W_q's and W_k's rows of head h × √γ_h; GQA (num_kv_heads < num_heads): W_q's
    rows of head h × γ_h, W_k untouched (its heads are shared)."""
    with torch.no_grad():
        for h in range(num_heads):
            s = float(max_logits[h])
            if s <= tau:
                continue
            gamma = tau / s
            rows = slice(h * head_dim, (h + 1) * head_dim)
            if num_kv_heads == num_heads:
                w_q[rows] *= math.sqrt(gamma)
                w_k[rows] *= math.sqrt(gamma)
            else:
                w_q[rows] *= gamma
