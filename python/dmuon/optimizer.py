"""`dmuon.DMuon`: Muon for matrices, AdamW for everything else, in one torch optimizer.

The Muon math (momentum, batched Newton–Schulz, lr adjustment, apply) runs in C++ through
``torch.ops.dmuon.muon_step_``; AdamW is torch's own implementation. This module routes
parameters, validates options, keeps the state in ``self.state`` (so ``state_dict`` works
as for any torch optimizer) and checks gradients for NaN/Inf with one host sync per step.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.optim.adam import adam as _torch_adam

from dmuon._ops import _C, ops
from dmuon.routing import RoutedParam, default_batch_dims, route_module, route_params

_NS_ALGORITHMS = ("gram", "standard")
_ADJUST_LR = (None, "original", "match_rms_adamw", "spectral")
_NONFINITE = ("raise", "skip")
_MUON_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

_MUON_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "ns_algorithm", "ns_coefficients",
              "ns_steps", "eps", "adjust_lr")
_ADAMW_KEYS = ("lr", "weight_decay", "betas", "eps")
# Bookkeeping kept in every group: steps taken (including skipped ones) and skipped steps.
_COUNTER_KEYS = ("num_steps", "num_skipped_steps")


class NonFiniteGradientError(FloatingPointError):
    """A gradient holds NaN or ±Inf (policy nonfinite='raise')."""


def _schedule_of(group: dict[str, Any]) -> tuple[list[float], list[int]]:
    """Flattened (a, b, c) per step and the restart iterations of a Muon group."""
    coefficients, restarts = _C.default_schedule(group["ns_algorithm"], group["ns_steps"])
    if group["ns_coefficients"] is not None:
        coefficients = group["ns_coefficients"]
    flat = [float(x) for step in coefficients for x in step]
    return flat, list(restarts) if group["ns_algorithm"] == "gram" else []


class DMuon(torch.optim.Optimizer):
    """Muon (orthogonalized momentum) for weight matrices and AdamW for the rest.

    ``params`` is an ``nn.Module`` (parameters are routed automatically, see
    :mod:`dmuon.routing`), an iterable of tensors or ``(name, tensor)`` pairs (``ndim ≥ 2``
    → Muon), or param-group dicts with ``use_muon=True/False`` and any per-group option.

    Muon options: ``lr``, ``momentum``, ``nesterov``, decoupled ``weight_decay``,
    ``ns_algorithm`` ("gram" | "standard"), ``ns_coefficients`` (one (a, b, c) per step;
    default: Polar Express ÷ 1.05 for gram, Keller Jordan's for standard), ``ns_steps``,
    ``eps`` (normalization floor), ``adjust_lr`` (None → ratio 1; "original" →
    √max(1, m/n); "match_rms_adamw" → 0.2·√max(m, n); "spectral" → √(m/n)).
    AdamW options (groups with ``use_muon=False``): ``adamw_lr`` (default: ``lr``),
    ``adamw_betas``, ``adamw_eps``, ``adamw_weight_decay`` (default: ``weight_decay``).
    ``nonfinite``: "raise" (error naming the parameter and step) or "skip" (the step
    changes nothing and is counted in ``num_skipped_steps``).
    """

    def __init__(
        self,
        params: nn.Module | Iterable[Any],
        lr: float = 1e-3,
        *,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.01,
        ns_algorithm: str = "gram",
        ns_coefficients: Iterable[Iterable[float]] | None = None,
        ns_steps: int = 5,
        eps: float = 1e-7,
        adjust_lr: str | None = "match_rms_adamw",
        adamw_lr: float | None = None,
        adamw_betas: tuple[float, float] = (0.9, 0.999),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float | None = None,
        nonfinite: str = "raise",
        muon_filter: Callable[[str, nn.Parameter], bool] | None = None,
    ) -> None:
        if nonfinite not in _NONFINITE:
            raise ValueError(f"nonfinite must be one of {_NONFINITE}, got {nonfinite!r}")
        self.nonfinite = nonfinite
        self._muon_defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
            ns_algorithm=ns_algorithm, ns_coefficients=ns_coefficients, ns_steps=ns_steps,
            eps=eps, adjust_lr=adjust_lr)
        self._adamw_defaults = dict(
            lr=lr if adamw_lr is None else adamw_lr,
            weight_decay=weight_decay if adamw_weight_decay is None else adamw_weight_decay,
            betas=adamw_betas, eps=adamw_eps)
        self._param_names: dict[int, str] = {}
        self._batch_dims: dict[int, int] = {}
        super().__init__(self._initial_groups(params, muon_filter), {"lr": lr})

    # ----------------------------------------------------------------- construction
    def _initial_groups(self, params: Any, muon_filter: Any) -> list[dict[str, Any]]:
        """Param groups from a module, an iterable of tensors, or group dicts."""
        if isinstance(params, nn.Module):
            routed = route_module(params, muon_filter)
            return self._groups_from_routed(routed)
        if muon_filter is not None:
            raise ValueError("muon_filter is only used when params is an nn.Module")
        items = list(params)
        if not items:
            raise ValueError("DMuon got an empty parameter list")
        if all(isinstance(item, dict) for item in items):
            return items
        if any(isinstance(item, dict) for item in items):
            raise TypeError("params mixes param-group dicts with tensors")
        return self._groups_from_routed(route_params(items, prefix="params"))

    def _groups_from_routed(self, routed: list[RoutedParam]) -> list[dict[str, Any]]:
        groups = []
        for use_muon in (True, False):
            chosen = [r for r in routed if r.use_muon == use_muon]
            if chosen:
                for r in chosen:
                    self._param_names[id(r.param)] = r.name
                    self._batch_dims[id(r.param)] = r.batch_dims
                groups.append({"params": [r.param for r in chosen], "use_muon": use_muon})
        if not groups:
            raise ValueError("DMuon found no trainable parameters")
        return groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Fill a group's options from the Muon or AdamW defaults and validate them."""
        group = dict(param_group)
        group_idx = len(self.param_groups)
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        names = []
        tensors = []
        for idx, item in enumerate(params):
            name, param = item if isinstance(item, tuple) else (None, item)
            name = name or self._param_names.get(id(param)) or f"param_groups[{group_idx}].params[{idx}]"
            self._param_names[id(param)] = name
            names.append(name)
            tensors.append(param)
        if "use_muon" not in group:
            kinds = {p.dim() >= 2 for p in tensors}
            if len(kinds) > 1:
                raise ValueError(f"param group {group_idx} mixes matrices and vectors; set use_muon=True or False")
            group["use_muon"] = kinds.pop() if kinds else True
        use_muon = bool(group["use_muon"])
        allowed = set(_MUON_KEYS if use_muon else _ADAMW_KEYS) | {"params", "use_muon", "initial_lr", *_COUNTER_KEYS}
        unknown = sorted(set(group) - allowed)
        if unknown:
            kind = "Muon" if use_muon else "AdamW"
            raise ValueError(f"param group {group_idx} ({kind}) has unknown option(s) {unknown}; allowed: {sorted(allowed - {'params'})}")
        for key, value in (self._muon_defaults if use_muon else self._adamw_defaults).items():
            group.setdefault(key, value)
        for key in _COUNTER_KEYS:
            group.setdefault(key, 0)
        group["params"] = tensors
        for name, param in zip(names, tensors):
            self._validate_param(name, param, use_muon)
            if use_muon:
                self._batch_dims.setdefault(id(param), default_batch_dims(param))
        if use_muon:
            self._validate_muon_group(group, group_idx)
        else:
            self._validate_adamw_group(group, group_idx)
        super().add_param_group(group)

    @staticmethod
    def _validate_param(name: str, param: torch.Tensor, use_muon: bool) -> None:
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"parameter {name!r} is a {type(param).__name__}, not a tensor")
        if not param.is_floating_point():
            raise TypeError(f"parameter {name!r} has dtype {param.dtype}; DMuon optimizes floating-point parameters")
        if use_muon:
            if param.dim() < 2:
                raise ValueError(f"parameter {name!r} of shape {tuple(param.shape)} was put in a Muon group, "
                                 "but Muon needs a matrix (ndim >= 2); put it in a use_muon=False group")
            if param.dtype not in _MUON_DTYPES:
                raise TypeError(f"parameter {name!r} has dtype {param.dtype}; Muon supports {[str(d) for d in _MUON_DTYPES]}")

    @staticmethod
    def _validate_muon_group(group: dict[str, Any], group_idx: int) -> None:
        where = f"param group {group_idx}"
        if group["ns_algorithm"] not in _NS_ALGORITHMS:
            raise ValueError(f"{where}: ns_algorithm must be one of {_NS_ALGORITHMS}, got {group['ns_algorithm']!r}")
        if group["adjust_lr"] not in _ADJUST_LR:
            raise ValueError(f"{where}: adjust_lr must be one of {_ADJUST_LR}, got {group['adjust_lr']!r}")
        steps = group["ns_steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 100:
            raise ValueError(f"{where}: ns_steps must be an integer in 1..100, got {steps!r}")
        if group["ns_coefficients"] is not None:
            coefficients = [tuple(float(x) for x in step) for step in group["ns_coefficients"]]
            if len(coefficients) == 1 and steps > 1:
                coefficients = coefficients * steps  # one (a, b, c) for every step, as torch.optim.Muon
            if len(coefficients) != steps or any(len(c) != 3 for c in coefficients):
                raise ValueError(f"{where}: ns_coefficients must be one (a, b, c) triple or ns_steps={steps} "
                                 f"triples, got {group['ns_coefficients']!r}")
            if not all(math.isfinite(x) for c in coefficients for x in c):
                raise ValueError(f"{where}: ns_coefficients must be finite, got {coefficients}")
            group["ns_coefficients"] = coefficients
        for key in ("lr", "weight_decay", "eps"):
            if not (isinstance(group[key], (int, float)) and math.isfinite(group[key]) and group[key] >= 0):
                raise ValueError(f"{where}: {key} must be a finite number >= 0, got {group[key]!r}")
        if group["eps"] <= 0:
            raise ValueError(f"{where}: eps must be > 0, got {group['eps']!r}")
        if not 0.0 <= group["momentum"] < 1.0:
            raise ValueError(f"{where}: momentum must be in [0, 1), got {group['momentum']!r}")

    @staticmethod
    def _validate_adamw_group(group: dict[str, Any], group_idx: int) -> None:
        where = f"param group {group_idx} (AdamW)"
        beta1, beta2 = group["betas"]
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"{where}: betas must be in [0, 1), got {group['betas']!r}")
        for key in ("lr", "weight_decay", "eps"):
            if not (isinstance(group[key], (int, float)) and math.isfinite(group[key]) and group[key] >= 0):
                raise ValueError(f"{where}: {key} must be a finite number >= 0, got {group[key]!r}")

    def param_name(self, param: torch.Tensor) -> str:
        """The name DMuon uses for `param` in messages."""
        return self._param_names.get(id(param), "<unnamed>")

    # ----------------------------------------------------------------------- step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        # Parameters with gradients, in group order.
        with_grads = [[p for p in group["params"] if p.grad is not None] for group in self.param_groups]
        for group_params in with_grads:
            for p in group_params:
                if p.grad.is_sparse:
                    raise RuntimeError(f"parameter {self.param_name(p)!r} has a sparse gradient; DMuon needs dense gradients")
        step_idx = self.param_groups[0]["num_steps"] + 1

        # NaN/Inf anywhere: one host sync for the whole model.
        flat = [p for group_params in with_grads for p in group_params]
        if flat:
            mask = ops.nonfinite_mask([p.grad for p in flat])
            if bool(mask.any()):
                bad = [self.param_name(p) for p, is_bad in zip(flat, mask.tolist()) if is_bad]
                if self.nonfinite == "raise":
                    raise NonFiniteGradientError(
                        f"non-finite gradient (NaN or Inf) in parameter {bad[0]!r} at step {step_idx}"
                        + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                        + "; nothing was updated. Use DMuon(..., nonfinite='skip') to skip such steps.")
                for group in self.param_groups:
                    group["num_steps"] += 1
                    group["num_skipped_steps"] += 1
                return loss

        for group, group_params in zip(self.param_groups, with_grads):
            group["num_steps"] += 1
            if not group_params:
                continue
            if group["use_muon"]:
                self._muon_group_step(group, group_params)
            else:
                self._adamw_group_step(group, group_params)
        return loss

    def _muon_group_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        buffers = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            buffers.append(state["momentum_buffer"])
        coefficients, restarts = _schedule_of(group)
        try:
            ops.muon_step_(
                params, [p.grad for p in params], buffers, [self._batch_dims[id(p)] for p in params],
                float(group["lr"]), float(group["weight_decay"]), float(group["momentum"]),
                bool(group["nesterov"]), group["adjust_lr"] or "none", group["ns_algorithm"],
                coefficients, restarts, float(group["eps"]))
        except RuntimeError as error:
            raise RuntimeError(self._name_params_in(str(error), params)) from error

    def _name_params_in(self, message: str, params: list[torch.Tensor]) -> str:
        """Replace 'parameter K' in a C++ message by the parameter's name."""
        import re

        def name_of(match: re.Match) -> str:
            idx = int(match.group(1))
            return f"parameter {self.param_name(params[idx])!r}" if idx < len(params) else match.group(0)

        return re.sub(r"parameter (\d+)", name_of, message)

    def _adamw_group_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        _torch_adam(params, [p.grad for p in params], exp_avgs, exp_avg_sqs, [], steps,
                    decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
                    lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                    maximize=False)
