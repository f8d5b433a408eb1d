"""Runs a function on N real processes over Gloo and returns each rank's result.

Workers live in importable modules (spawned processes import them by name). Any worker
exception is re-raised in the test with its rank and traceback; a run that exceeds its
deadline is killed and reported, never left hanging.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import traceback
from typing import Any, Callable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn: Callable, rank: int, world: int, port: int, timeout_s: float, args: tuple, queue) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      OMP_NUM_THREADS="1")
    try:
        import torch

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        result = fn(rank, world, *args)
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def run_distributed(fn: Callable, world: int, *args: Any, timeout_s: float = 120.0,
                    collective_timeout_s: float = 60.0, expect_errors: bool = False) -> dict[int, Any]:
    """fn(rank, world, *args) on `world` processes; {rank: result} (or {rank: traceback}
    with expect_errors). Raises if any rank fails (unless expect_errors) or the deadline passes."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, collective_timeout_s, args, queue), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        for _ in range(world):
            rank, status, payload = queue.get(timeout=timeout_s)
            (results if status == "ok" else errors)[rank] = payload
    except Exception as error:  # queue.Empty: some rank never finished
        raise TimeoutError(f"distributed run exceeded {timeout_s} s; finished ranks: "
                           f"{sorted(results) + sorted(errors)}; errors: {errors}") from error
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if expect_errors:
        return {**results, **errors}
    if errors:
        rank = min(errors)
        raise AssertionError(f"rank {rank} of {world} failed:\n{errors[rank]}")
    return results
