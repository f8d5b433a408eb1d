"""Checkpoints that a killed or failed save cannot tear, over torch.distributed.checkpoint.

``save(state, directory)`` writes into a fresh sibling directory (``<directory>.saving``),
writes a marker file last (the name and size of every file the save wrote), and only then
swaps it in by renames: the previous checkpoint at ``directory`` stays whole until the new
one is complete. ``load(state, directory)`` refuses a directory without a valid marker, or
whose files differ from it, with `CheckpointError` (an ``Exception``; DCP's own
``CheckpointException`` derives from ``BaseException`` and is wrapped in it). A save of a
torn optimizer's state (dmuon.torn_state: a step failed after it began writing) is
refused on every rank before anything is written, unless ``torn_ok=True``.

NOTE: DCP saved straight over a previous checkpoint and killed halfway loads without an
error, 21 of 27 tensors from one step and the rest from the other (measured on 3 Gloo ranks,
FSDP2); hence the sibling directory and the marker.

    dmuon.checkpoint.save({"model": msd, "optim": osd}, "ckpt/latest")
    dmuon.checkpoint.load(state, "ckpt/latest")   # state: the fresh model's and optimizer's
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from dmuon import torn_state

MARKER = "dmuon_checkpoint.json"
_FORMAT = "dmuon-checkpoint 1"


class CheckpointError(Exception):
    """A checkpoint that is torn, incomplete or missing, or a save or load that failed."""


def _siblings(directory: Path) -> tuple[Path, Path]:
    """Where a save writes (staging) and where the checkpoint it replaces waits (previous)."""
    return directory.with_name(directory.name + ".saving"), directory.with_name(directory.name + ".previous")


def _files(directory: Path) -> dict[str, int]:
    """Every file under `directory` but the marker, by path relative to it: its size."""
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != MARKER}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _why_incomplete(directory: Path) -> str | None:
    """None for a complete checkpoint, else what is wrong with it."""
    if not directory.is_dir():
        return "no such directory"
    try:
        marker = json.loads((directory / MARKER).read_text())
    except FileNotFoundError:
        return f"no {MARKER} (a save that did not finish, or not saved by dmuon.checkpoint.save)"
    except (OSError, ValueError) as error:
        return f"unreadable {MARKER}: {error}"
    if not isinstance(marker, dict) or marker.get("format") != _FORMAT or not isinstance(marker.get("files"), dict):
        return f"{MARKER} is not a dmuon checkpoint marker"
    found = _files(directory)
    for name, size in marker["files"].items():
        if name not in found:
            return f"{name} is missing"
        if found[name] != size:
            return f"{name} holds {found[name]} bytes, the save wrote {size}"
    return None


def _mark_complete(staging: Path) -> None:
    """The marker, written last: atomically (tmp, fsync, rename), the directory synced after."""
    text = json.dumps({"format": _FORMAT, "files": _files(staging)}, indent=1, sort_keys=True)
    tmp = staging / (MARKER + ".tmp")
    with open(tmp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.rename(tmp, staging / MARKER)
    _fsync(staging)


def _swap_in(staging: Path, directory: Path, previous: Path) -> None:
    """The complete staging directory becomes `directory`; the checkpoint it replaces waits
    at `previous` until then and is removed after."""
    if previous.exists():
        shutil.rmtree(previous)
    if directory.exists():
        os.rename(directory, previous)
    os.rename(staging, directory)
    _fsync(directory.parent)
    if previous.exists():
        shutil.rmtree(previous)


def _prepare(staging: Path, directory: Path, previous: Path) -> None:
    """A fresh staging directory; refuses to replace a directory that holds something other
    than a dmuon checkpoint."""
    if directory.exists() and any(directory.iterdir()) and _why_incomplete(directory) is not None:
        raise CheckpointError(f"{directory} holds files but no complete dmuon checkpoint "
                              f"({_why_incomplete(directory)}); not replacing it")
    # NOTE: a save killed between its two renames left the last complete checkpoint at
    # `previous` and none at `directory`: it is moved back first, never removed.
    if not directory.exists() and previous.exists() and _why_incomplete(previous) is None:
        os.rename(previous, directory)
    if staging.exists():
        shutil.rmtree(staging)  # what a killed save left
    staging.parent.mkdir(parents=True, exist_ok=True)


def _on_rank0(fn: Callable[[], Any], what: str, group: Any, refusal: Exception | None = None) -> Any:
    """fn() on rank 0 of `group` (the only process without one), its value returned on every
    rank; its error raised on every rank as CheckpointError naming `what` (the other ranks
    wait for it here). `refusal`: why this rank refuses the operation (None: it does not);
    raised there and as CheckpointError naming it on the other ranks."""
    distributed = dist.is_available() and dist.is_initialized()
    value, error = None, None
    if not distributed or dist.get_rank(group) == 0:
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - every failure is named on every rank
            error = e if isinstance(e, CheckpointError) else f"{what} failed on rank 0: {type(e).__name__}: {e}"
    refusals = [(0, refusal)]
    if distributed:
        boxes: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(boxes, (value, str(error) if error is not None else None,
                                       None if refusal is None else str(refusal)), group=group)
        value, error, _ = boxes[0]
        refusals = list(enumerate(box[2] for box in boxes))
    if refusal is not None:
        raise refusal
    for rank, why in refusals:
        if why is not None:
            raise CheckpointError(f"{what}: rank {rank} refused it: {why}")
    if error is not None:
        raise CheckpointError(str(error))
    return value


def _dcp(call: Callable[..., None], state: dict[str, Any], path: str, process_group: Any) -> None:
    """A DCP save or load; in one process without a process group, without DCP's warning
    that it assumes one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        call(state, checkpoint_id=path, process_group=process_group)


def save(state: dict[str, Any], directory: str | os.PathLike, *, process_group: Any = None,
         torn_ok: bool = False) -> None:
    """torch.distributed.checkpoint.save of `state` (e.g. {"model": msd, "optim": osd} from
    get_state_dict), collective over `process_group`, into a fresh sibling directory marked
    complete last, then renamed to `directory`; the checkpoint it replaces is kept until the
    new one is complete. Raises CheckpointError on every rank if any part fails; where
    `state` holds a torn DMuon's tensors (dmuon.torn_state), TornStateError there and
    CheckpointError on the others, before anything is written, unless `torn_ok`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    directory = Path(directory).absolute()
    staging, previous = _siblings(directory)
    # NOTE: a torn state after a failed collective is refused at once (the world is broken);
    # after a failure of this rank's own, the refusal rides on the first collective, so that
    # no rank waits for one that refused.
    torn = None if torn_ok else torn_state.refusal(state)
    if torn is not None and not torn.agree:
        raise torn_state.TornStateError(torn.message("dmuon.checkpoint.save"))
    refusal = torn_state.TornStateError(torn.message("dmuon.checkpoint.save")) if torn is not None else None
    freed = _freed_tensor(state) if refusal is None else None
    if freed is not None:
        refusal = CheckpointError(
            f"dmuon.checkpoint.save: {freed} holds no memory on this rank (a weight of the weight-ownership mode "
            "that this rank does not own, or its momentum): save inside `with owned.materialized(optimizer):`, "
            "where every rank holds every owned weight")
    _on_rank0(lambda: _prepare(staging, directory, previous), f"preparing to save {directory}", process_group, refusal)
    try:
        _dcp(dcp.save, state, str(staging), process_group)
    except CheckpointException as error:
        raise CheckpointError(f"saving {directory} (into {staging}) failed: {error}") from error

    def finish() -> None:
        _mark_complete(staging)
        _swap_in(staging, directory, previous)

    _on_rank0(finish, f"completing the save of {directory}", process_group)


def _freed_tensor(state: dict[str, Any]) -> str | None:
    """The key path of a tensor in `state` whose storage was freed (elements over a storage
    of no bytes: dmuon.own_matrices frees the non-owners' weights outside `materialized`),
    or None. NOTE: DCP reads such a tensor's memory and crashed the process (a segfault
    inside torch.distributed.checkpoint) where it was not refused here."""
    from torch.utils._pytree import keystr, tree_flatten_with_path

    for path, leaf in tree_flatten_with_path(state)[0]:
        tensor = getattr(leaf, "_local_tensor", leaf)
        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0 or tensor.is_meta:
            continue
        try:
            freed = tensor.untyped_storage().nbytes() == 0
        except (RuntimeError, NotImplementedError):  # NOTE: subclasses without a storage of their own
            continue
        if freed:
            return f"state{keystr(path)}"
    return None


def found(directory: str | os.PathLike) -> bool:
    """Whether `load` has anything to read at `directory`: a checkpoint there, or (a save
    killed between its two renames) at ``<directory>.previous``. Complete or not: `load`
    names what is wrong with one that is not."""
    path = Path(directory)
    return path.exists() or _siblings(path)[1].exists()


def load(state: dict[str, Any], directory: str | os.PathLike, *, process_group: Any = None) -> None:
    """torch.distributed.checkpoint.load into `state` (in place) from a checkpoint that
    `save` completed; a torn, incomplete or missing one raises CheckpointError, naming what
    is wrong, before anything is loaded. Where a save was killed between its two renames,
    the last complete checkpoint (``<directory>.previous``) is loaded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    def resolve() -> str:
        path = Path(directory).absolute()
        _, previous = _siblings(path)
        if not path.exists() and _why_incomplete(previous) is None:
            path = previous
        why = _why_incomplete(path)
        if why is not None:
            raise CheckpointError(f"{path} is not a complete checkpoint: {why}")
        return str(path)

    path = _on_rank0(resolve, f"checking {directory}", process_group)
    try:
        _dcp(dcp.load, state, path, process_group)
    except CheckpointException as error:
        raise CheckpointError(f"loading {path} failed: {error}") from error
