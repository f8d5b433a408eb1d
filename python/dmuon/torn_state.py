"""A step that failed after it began writing leaves DMuon's state possibly torn.

Once a step's writes began on this rank (the engine's momentum and parameter writes,
``EngineRuntime.writes_began``, or the AdamW part) and an exception escapes it, momentum
and parameters may be partly stepped (a rank lost mid-step: every momentum buffer advanced,
a few weight shards stepped, different ones on each rank). DMuon records the failed step
(`TornStep`); until ``load_state_dict`` its ``step()``, ``state_dict()`` and
``dmuon.checkpoint.save`` of its tensors raise `TornStateError`. ``torn_ok=True`` (of
``state_dict`` and ``checkpoint.save``) reads the torn state anyway, for a post-mortem.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from dmuon import distributed


class TornStateError(RuntimeError):
    """DMuon's state may be torn by a step that failed after this rank began writing it;
    only reloading the last checkpoint (the model's and the optimizer's) is safe."""


@dataclass(frozen=True)
class TornStep:
    """The step that failed after this rank began writing."""
    step_idx: int
    phase: str  # where it failed: "the Muon part", "the AdamW part", "the result agreement", "QK-clip"
    error: str  # the original error's type and first line
    # The failure was this rank's own and the step's collectives completed: its next step
    # joins the start agreement with this error, so that no other rank waits for it.
    agree: bool

    def message(self, refused: str) -> str:
        return (f"{refused} refused: the optimizer's state may be torn: step {self.step_idx} failed in {self.phase} "
                f"after this rank began writing momentum and parameters ({self.error}). Only reloading the last "
                "checkpoint (the model's and the optimizer's: load_state_dict) is safe; for a post-mortem, "
                "state_dict(torn_ok=True) and dmuon.checkpoint.save(..., torn_ok=True) read the torn state anyway")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


_TORN: weakref.WeakSet = weakref.WeakSet()  # optimizers whose torn_step is set


def mark(optimizer: Any, step: TornStep) -> None:
    optimizer._torn = step
    _TORN.add(optimizer)


def clear(optimizer: Any) -> None:
    optimizer._torn = None
    _TORN.discard(optimizer)


def _storage(t: torch.Tensor) -> int:
    t = distributed.local(t)
    return t.untyped_storage().data_ptr() if t.numel() else 0


def refusal(state: Any) -> TornStep | None:
    """Why `state` (what dmuon.checkpoint.save is given) must not be saved: the torn step of
    an optimizer it holds, or whose parameters' or state's memory one of its tensors is in
    (a state dict made before the step failed holds the same tensors); else None."""
    torn = [opt for opt in list(_TORN) if opt._torn is not None]
    if not torn:
        return None
    leaves = tree_flatten(state)[0]
    owner: dict[int, Any] = {}
    for opt in torn:
        if any(leaf is opt for leaf in leaves):
            return opt._torn
        tensors = [p for g in opt.param_groups for p in g["params"]]
        tensors += [v for entry in opt.state.values() for v in entry.values() if isinstance(v, torch.Tensor)]
        owner.update((_storage(t), opt) for t in tensors)
    owner.pop(0, None)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and _storage(leaf) in owner:
            return owner[_storage(leaf)]._torn
    return None
