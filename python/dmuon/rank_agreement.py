"""What the ranks of DMuon's process group must agree on, so that a disagreement raises on
every rank with a name instead of hanging or training wrongly:

- at construction, that the parameters DMuon treats as replicas (plain tensors on a
  multi-rank group: DDP) are equal on every rank (`check_replicas_equal`, one collective);
- at every step, before anything is written or any other collective runs, that every rank
  has the same param groups (an ``add_param_group`` on some ranks only) and that every
  rank's own checks passed: the step engine's start agreement, from `structure_signature`
  and `describe_groups` (dmuon._C.engine.StepChecks).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import torch
import torch.distributed as dist

# process_group value meaning: every rank trains its own parameters (no communication).
LOCAL = "local"

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _device_of(group: Any) -> torch.device:
    """Where the group's collectives take their tensors (NCCL: the current CUDA device)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _bit_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of the tensor's bit patterns as integers (int64 0-d tensor on its device: exact,
    independent of summation order). NOTE: equal on every rank exactly when the ranks hold
    bit-identical values, up to a permutation of entries or a collision: the check is aimed at
    independently initialized or trained models, not at adversarial differences."""
    local = t.detach()
    if local.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=local.device)
    local = local.contiguous().reshape(-1)
    if local.is_complex():
        local = torch.view_as_real(local).reshape(-1)
    return local.view(_INT_VIEW[local.element_size()]).sum(dtype=torch.int64)


def check_replicas_equal(group: Any, names: list[str], tensors: list[torch.Tensor]) -> None:
    """Raise on every rank, naming the first parameter whose values differ across the ranks of
    `group` (one all_reduce of a checksum per parameter, one copy to the host)."""
    if group is None or dist.get_world_size(group) == 1 or not tensors:
        return
    device = _device_of(group)
    sums = torch.stack([_bit_sum(t).to(device) for t in tensors])
    # NOTE: max over ranks of (s, −s) gives max(s) and −min(s): equal iff every rank agrees.
    both = torch.cat([sums, -sums])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    both = both.cpu()
    n = len(tensors)
    for idx in range(n):
        if int(both[idx]) != -int(both[n + idx]):
            raise ValueError(
                f"parameter {names[idx]!r} differs across the {dist.get_world_size(group)} ranks of DMuon's "
                "process group. DMuon treats plain (non-DTensor) parameters on a multi-rank process group as "
                "data-parallel replicas and applies one owner's update on every rank. Make them equal before "
                "constructing DMuon (wrap the model in DDP first, which broadcasts rank 0's parameters, or seed "
                "every rank alike), pass the replicas' group as process_group=, or pass "
                f"process_group={LOCAL!r} if every rank trains its own model (no communication).")


def structure_signature(param_groups: list[dict[str, Any]]) -> int:
    """A 62-bit hash of the param groups' structure: kind, size, shapes and split of every
    group (what the step runtime is made from)."""
    digest = hashlib.blake2b(digest_size=8)
    for group in param_groups:
        split = tuple(group.get(key) for key in ("split_rows", "split_heads", "split_dim"))
        digest.update(repr((bool(group["use_muon"]), [tuple(p.shape) for p in group["params"]], split)).encode())
    return int.from_bytes(digest.digest(), "little") >> 2


def describe_groups(param_groups: list[dict[str, Any]], name_of: Callable[[torch.Tensor], str]) -> list[str]:
    """Every group in words: kind, number of parameters, the first one's name and shape."""
    lines = []
    for group in param_groups:
        params = group["params"]
        first = f"{name_of(params[0])!r} {tuple(params[0].shape)}" if params else "'' ()"
        lines.append(f"{'Muon' if group['use_muon'] else 'AdamW'}, {len(params)} parameter(s), first {first}")
    return lines
