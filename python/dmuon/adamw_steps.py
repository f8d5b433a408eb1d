"""DMuon's AdamW part: torch's AdamW over the local tensors of each AdamW group, and device
copies of its step counters for torch's fused AdamW on CUDA.

DMuon keeps each AdamW parameter's ``state["step"]`` as torch's non-fused AdamW does: a
float32 scalar on the CPU (what checkpoints hold). torch's fused kernel reads the counters
on the parameters' device, so DMuon's AdamW part keeps a device copy of each one, made
again whenever the CPU counter is not the value it last gave it (a loaded checkpoint, a
counter set by hand), and advances both after the step.
NOTE: why fused: on a fake rank of world 64 (Qwen2.5-1.5B, one H200) the foreach passes of
DMuon's AdamW part took 3.7-5.6 ms of host time inside step(), against 7.4-8.8 ms for the
whole fused AdamW baseline over every parameter (BENCHMARKS.md, "Host time of the step,
and the step begun from backward").
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.adam import adam as _torch_adam

from dmuon import distributed
from dmuon.state_checks import adamw_state_dtype


def adamw_state(state: dict[torch.Tensor, dict[str, Any]], p: torch.Tensor) -> dict[str, Any]:
    """`p`'s AdamW state, created (zeros, step 0) on first use (float32 moments for float16)."""
    entry = state[p]
    if "step" not in entry:
        entry["step"] = torch.tensor(0.0, dtype=torch.float32)
        dtype = adamw_state_dtype(p)
        entry["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
        entry["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
    return entry


def adamw_group_step(group: dict[str, Any], params: list[torch.Tensor], state: dict[torch.Tensor, dict[str, Any]],
                     device_steps: "DeviceSteps") -> None:
    """torch's AdamW over `params` (of AdamW group `group`). NOTE: float16 parameters step
    through float32 copies (their moments are float32) and are rounded back: in float16 the
    second moment of small gradients underflows to 0 and eps (1e-8) to 0, and the update
    divides by it.
    NOTE: on the local tensors of DTensor parameters whose gradient lies as they do (the
    same placements): AdamW is elementwise, so each rank's shard steps alone, bitwise as
    through DTensor, without DTensor's dispatch of each of AdamW's passes (measured on a
    CPU fake rank of world 64, Qwen2.5-0.5B's 122 AdamW parameters: 8.7 ms through
    DTensor, 4.6 ms on the local tensors, compute included); on one CUDA device, through
    torch's fused kernel (DeviceSteps); on the CPU through its foreach passes."""
    exp_avgs, exp_avg_sqs, steps, targets, grads, halves = [], [], [], [], [], []
    states = [adamw_state(state, p) for p in params]
    # NOTE: one form for the whole list (torch's foreach passes take no mix of the two).
    local = all(distributed.same_layout(p, p.grad) and distributed.same_layout(p, s["exp_avg"])
                and distributed.same_layout(p, s["exp_avg_sq"]) for p, s in zip(params, states))
    view = distributed.local if local else (lambda t: t)
    for p, s in zip(params, states):
        exp_avgs.append(view(s["exp_avg"]))
        exp_avg_sqs.append(view(s["exp_avg_sq"]))
        steps.append(s["step"])
        if p.dtype == torch.float16:
            targets.append(view(p).float())
            grads.append(view(p.grad).float())
            halves.append((view(p), targets[-1]))
        else:
            targets.append(view(p))
            grads.append(view(p.grad))
    beta1, beta2 = group["betas"]
    options = dict(decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                   weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
    # The one device every local tensor is on (None: DTensors, or several devices).
    devices = {t.device for t in targets} if local else set()
    device = next(iter(devices)) if len(devices) == 1 else None
    if device is not None and device.type == "cuda":
        # NOTE: torch's fused kernel (one launch per dtype; this module's docstring says
        # why), on device copies of the CPU step counters.
        on_device = device_steps.of(id(group), steps, device)
        _torch_adam(targets, grads, exp_avgs, exp_avg_sqs, [], on_device, fused=True, **options)
        device_steps.advanced(id(group), steps)
    else:
        # NOTE: on the CPU, torch's foreach passes: bitwise what torch.optim.AdamW's default
        # (one tensor at a time) computes there, in fewer calls (143 small tensors, the
        # AdamW part of Qwen2.5-7B at 1/64 width on a CPU fake rank of world 64: 3.4 ms
        # one at a time, 1.8 ms foreach).
        on_cpu = device is not None and device.type == "cpu"
        _torch_adam(targets, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True if on_cpu else None, **options)
    for p, full in halves:
        p.copy_(full)


class DeviceSteps:
    """Device copies of CPU step counters, one table per AdamW param group."""

    def __init__(self) -> None:
        # group key → {id(cpu step): (cpu step, device step, the value both hold)}
        self._groups: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {}

    def of(self, group_key: int, steps: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """The device counters of `steps` (CPU scalars), made or refreshed where needed; the
        group's table keeps only these (counters of removed parameters are dropped)."""
        old = self._groups.get(group_key, {})
        table: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}
        out = []
        for step in steps:
            value = float(step)  # NOTE: a CPU scalar: no device wait
            entry = old.get(id(step))
            if entry is None or entry[0] is not step or entry[2] != value or entry[1].device != device:
                entry = (step, torch.full((), value, dtype=torch.float32, device=device), value)
            table[id(step)] = entry
            out.append(entry[1])
        self._groups[group_key] = table
        return out

    def advanced(self, group_key: int, steps: list[torch.Tensor]) -> None:
        """After the fused step advanced the device counters of `steps` by one: the CPU
        counters too, and the values the table expects."""
        torch._foreach_add_(steps, 1.0)
        table = self._groups.get(group_key, {})
        for step in steps:
            entry = table.get(id(step))
            if entry is not None:
                table[id(step)] = (entry[0], entry[1], entry[2] + 1.0)
