"""The tests' view of dmuon.launch: Gloo processes on the CPU (or NCCL, one process per
GPU), errors as assertions."""

from __future__ import annotations

from typing import Any, Callable

from dmuon.launch import RankFailed, launch


def run_distributed(fn: Callable, world: int, *args: Any, backend: str = "gloo", timeout_s: float = 180.0,
                    collective_timeout_s: float = 60.0, expect_errors: bool = False) -> dict[int, Any]:
    """fn(rank, world, *args) on `world` processes over `backend` ("gloo": CPU processes;
    "nccl": rank r on GPU r); {rank: result}."""
    try:
        return launch(fn, world, *args, backend=backend, timeout_s=timeout_s,
                      collective_timeout_s=collective_timeout_s, return_errors=expect_errors)
    except RankFailed as error:
        raise AssertionError(str(error)) from None
