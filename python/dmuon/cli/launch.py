"""Local multi-process launcher: runs fn(rank, world, *args) on `world` spawned processes,
over Gloo on CPUs or NCCL with one GPU per rank, and returns every rank's result.

Used by `python -m dmuon train --world N`, `python -m dmuon bench step`, and the tests.
A rank's exception is re-raised in the parent with its rank and traceback; a run past its
deadline is killed and reported, never left hanging.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_module
import socket
import time
import traceback
from typing import Any, Callable

# NOTE: NVLink multicast stays off: on shared multi-GPU hosts a program using it can take
# the GPUs out of service (see the device notes); these are the variables NCCL, PyTorch's
# symmetric memory and NVSHMEM read.
_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class RankFailed(RuntimeError):
    """A rank raised; the message holds its rank and traceback."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn: Callable, rank: int, world: int, port: int, backend: str, timeout_s: float,
           threads: int, args: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS=str(threads), **_SAFE_ENV)
    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=torch.device("cuda", rank) if backend == "nccl" else None)
        results.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def default_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def resolve_device(device: str, *, argument: str = "--device") -> str:
    """'auto' → cuda when a GPU is visible, else cpu; 'cuda' without a GPU is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"{argument} must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{argument} cuda: no CUDA GPU is visible")
    return device


def resolve_world(world: str | int, device: str, *, argument: str = "--world") -> int:
    """A world size from a command line: "auto" is every local GPU on CUDA (2 processes on
    the CPU); a number must be >= 1 and, on CUDA, at most the number of GPUs."""
    import torch

    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    num_gpus = torch.cuda.device_count() if device == "cuda" else 0
    if world == "auto":
        if device == "cpu":
            return 2
        if num_gpus < 1:
            raise ValueError(f"{argument} auto: no CUDA GPU is visible")
        return num_gpus
    try:
        value = int(world)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be 'auto' or a positive integer, got {world!r}") from None
    if value < 1:
        raise ValueError(f"{argument} must be >= 1, got {value}")
    if device == "cuda" and value > num_gpus:
        raise ValueError(f"{argument} {value} needs {value} GPUs (one per rank over NCCL), found {num_gpus}")
    return value


def launch(fn: Callable, world: int, *args: Any, backend: str | None = None, timeout_s: float = 600.0,
           collective_timeout_s: float = 120.0, return_errors: bool = False,
           abort_after_failure_s: float | None = None) -> dict[int, Any]:
    """fn(rank, world, *args) on `world` processes; {rank: result}. With return_errors,
    failed ranks map to their traceback text instead of raising RankFailed.
    backend "gloo": CPU processes; "nccl": rank r drives GPU r (torch.cuda.set_device(r)).
    abort_after_failure_s: once a rank has failed, the ranks still running get that many
    seconds to finish or fail, then are killed (default: they run until their own
    collective timeout reports them, which keeps their messages)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if abort_after_failure_s is not None and not abort_after_failure_s >= 0:
        raise ValueError(f"abort_after_failure_s must be >= 0 or None, got {abort_after_failure_s}")
    backend = backend or default_backend()
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        import torch

        if torch.cuda.device_count() < world:
            raise ValueError(f"--world {world} needs {world} GPUs with NCCL, found {torch.cuda.device_count()}")
    threads = max(1, (os.cpu_count() or 1) // world)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, daemon=True,
                         args=(fn, r, world, port, backend, collective_timeout_s, threads, args, results))
             for r in range(world)]
    for p in procs:
        p.start()
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    abort_at: float | None = None
    killed: set[int] = set()
    try:
        # NOTE: poll, so that a rank that dies without reporting (a crash, os._exit) is
        # noticed at once instead of after the whole deadline.
        while len(done) + len(errors) < world:
            try:
                rank, status, payload = results.get(timeout=0.5)
                (done if status == "ok" else errors)[rank] = payload
                continue
            except queue_module.Empty:
                pass
            for rank, p in enumerate(procs):
                if rank not in done and rank not in errors and p.exitcode is not None:
                    try:  # its last words may still be in the queue
                        r, status, payload = results.get(timeout=1.0)
                        (done if status == "ok" else errors)[r] = payload
                    except queue_module.Empty:
                        errors[rank] = f"rank {rank} exited with code {p.exitcode} without reporting"
            if errors and abort_after_failure_s is not None:
                if abort_at is None:
                    abort_at = time.monotonic() + abort_after_failure_s
                elif time.monotonic() > abort_at:
                    # NOTE: the others wait in a collective the failed rank never joins.
                    first = next(iter(errors))
                    for rank, p in enumerate(procs):
                        if rank not in done and rank not in errors:
                            p.kill()
                            killed.add(rank)
                            errors[rank] = (f"rank {rank} was killed {abort_after_failure_s:.0f} s after rank "
                                            f"{first} failed")
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"a {world}-rank run exceeded {timeout_s:.0f} s; ranks that finished: "
                                   f"{sorted(done)}, ranks that failed: {errors}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if return_errors:
        return {**done, **errors}
    if errors:
        rank = min(set(errors) - killed)  # NOTE: a failure, not a rank killed because of one
        raise RankFailed(f"rank {rank} of {world} failed:\n{errors[rank]}")
    return done
