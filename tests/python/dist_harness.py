"""The tests' view of dmuon.cli.launch: Gloo processes on the CPU (or NCCL, one process per
GPU), errors as assertions.

Gloo runs go to a started world of that size shared by the whole pytest run
(dist_pool.py) unless they need fresh processes: `fresh=True` (launcher behaviour, a
rank that dies or stalls), `expect_errors=True` (a failing rank ends a pool anyway), or
a knob in the environment that differs from the tests' start (DMUON_* knobs are read once
per process, so a monkeypatched variable needs a new one)."""

from __future__ import annotations

import os
from typing import Any, Callable

from dmuon.cli.launch import RankFailed, launch

import dist_pool

# NOTE: the variables a rank's behaviour may depend on (dmuon's knobs, which a process reads
# once, and those of torch.distributed, the backends, threading and malloc), as the tests
# started. Others change under a run by themselves (PYTEST_CURRENT_TEST, TORCHINDUCTOR_CACHE_DIR
# set by an import) and are not compared.
_KNOB_PREFIXES = ("DMUON_", "TORCH_", "NCCL_", "GLOO_", "OMP_", "MKL_", "MASTER_", "CUDA_", "MALLOC_")


def _knobs() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_KNOB_PREFIXES)}


_START_KNOBS = _knobs()


def _environment_changed() -> bool:
    return _knobs() != _START_KNOBS


def run_distributed(fn: Callable, world: int, *args: Any, backend: str = "gloo", timeout_s: float = 180.0,
                    collective_timeout_s: float = 60.0, expect_errors: bool = False,
                    fresh: bool = False) -> dict[int, Any]:
    """fn(rank, world, *args) on `world` processes over `backend` ("gloo": CPU processes;
    "nccl": rank r on GPU r); {rank: result}. With expect_errors, failed ranks map to their
    traceback text. fresh: spawn new processes even where a pooled world would do."""
    try:
        if backend == "gloo" and not (fresh or expect_errors or _environment_changed()):
            return dist_pool.pooled_run(fn, world, args, timeout_s, collective_timeout_s)
        return launch(fn, world, *args, backend=backend, timeout_s=timeout_s,
                      collective_timeout_s=collective_timeout_s, return_errors=expect_errors)
    except RankFailed as error:
        raise AssertionError(str(error)) from None
