"""What the ranks of DMuon's process group must agree on, checked with one small collective
each, so that a disagreement raises on every rank with a name instead of hanging or
training wrongly:

- at construction, that the parameters DMuon treats as replicas (plain tensors on a
  multi-rank group: DDP) are equal on every rank (`check_replicas_equal`);
- at every step, before anything is written or any other collective runs, that every rank
  has the same param groups (an ``add_param_group`` on some ranks only) and that every
  rank's own checks passed (`agree_before_step`).
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
    """A 62-bit hash of the param groups' structure: kind, size and shapes of every group."""
    digest = hashlib.blake2b(digest_size=8)
    for group in param_groups:
        digest.update(repr((bool(group["use_muon"]), [tuple(p.shape) for p in group["params"]])).encode())
    return int.from_bytes(digest.digest(), "little") >> 2


def describe_groups(param_groups: list[dict[str, Any]], name_of: Callable[[torch.Tensor], str]) -> list[tuple]:
    """(kind, number of parameters, first parameter's name and shape) of every group."""
    return [("Muon" if group["use_muon"] else "AdamW", len(group["params"]),
             name_of(group["params"][0]) if group["params"] else "", tuple(group["params"][0].shape)
             if group["params"] else ()) for group in param_groups]


def agree_before_step(group: Any, step_idx: int, signature: int, local_error: str,
                      describe: Callable[[], list[tuple]]) -> None:
    """One all_reduce of a fixed size, before any other collective of the step: every rank has
    the same param groups (`signature`) and no rank's checks failed (`local_error` non-empty).
    Otherwise every rank raises RuntimeError, naming the group that differs or the failing
    rank's error."""
    if group is None or dist.get_world_size(group) == 1:
        if local_error:
            raise RuntimeError(local_error)
        return
    high, low = signature >> 31, signature & (2**31 - 1)
    header = torch.tensor([high, -high, low, -low, int(bool(local_error))], dtype=torch.int64,
                          device=_device_of(group))
    try:
        dist.all_reduce(header, op=dist.ReduceOp.MAX, group=group)
        values = header.cpu().tolist()
    except Exception as error:  # NOTE: a dead or stalled rank: name the step and the collective
        raise RuntimeError(f"dmuon step {step_idx}: the all_reduce of the step's agreement (param groups and "
                           f"checks) failed on rank {dist.get_rank(group)} of {dist.get_world_size(group)}: "
                           f"{error}") from error
    same = values[0] == -values[1] and values[2] == -values[3]
    if same and not values[4]:
        return
    # NOTE: only on failure: every rank is here, so one all_gather_object lets each name it.
    world = dist.get_world_size(group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (local_error, describe() if not same else None), group=group)
    if not same:
        raise RuntimeError(f"dmuon step {step_idx}: {_first_group_difference([g[1] for g in gathered])}; "
                         "add_param_group (and every change to param groups) must happen on every rank")
    rank, error = next((r, g[0]) for r, g in enumerate(gathered) if g[0])
    if local_error:
        raise RuntimeError(local_error)
    raise RuntimeError(f"dmuon step {step_idx}: rank {rank} failed its checks before writing anything, so no rank "
                     f"stepped: {error}")


def _first_group_difference(descriptions: list[list[tuple]]) -> str:
    """The first param group that is not the same on every rank, in words."""
    num_groups = max(len(d) for d in descriptions)
    for g_idx in range(num_groups):
        entries = [d[g_idx] if g_idx < len(d) else None for d in descriptions]
        if all(e == entries[0] for e in entries):
            continue
        present = next(e for e in entries if e is not None)
        kind, count, first, shape = present
        missing = [r for r, e in enumerate(entries) if e is None]
        if missing:
            having = [r for r, e in enumerate(entries) if e is not None]
            return (f"param group {g_idx} ({kind}, {count} parameter(s), first {first!r} {shape}) exists on "
                    f"rank(s) {having} but not on rank(s) {missing}")
        by_rank = "; ".join(f"rank {r}: {e[0]}, {e[1]} parameter(s), first {e[2]!r} {e[3]}"
                            for r, e in enumerate(entries))
        return f"param group {g_idx} differs across ranks ({by_rank})"
    return "the param groups' parameter shapes differ across ranks"
