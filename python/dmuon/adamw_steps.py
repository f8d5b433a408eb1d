"""Device copies of AdamW's step counters, for torch's fused AdamW on CUDA.

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

import torch


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
