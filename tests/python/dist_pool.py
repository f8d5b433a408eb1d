"""Started Gloo processes that the distributed tests share: one pool of CPU processes for
the whole pytest run (4, or the largest world asked for), each task on a process group of
its own world size made for it from the pool's first processes.

Why: a spawned rank imports torch and dmuon before it runs anything; on a 2-core machine
that start-up was most of the distributed tests' time. A pool pays it once.

Each task: each of its ranks makes a fresh default process group over the pool's TCPStore
(a prefix per task), runs fn(rank, world, *args), destroys every group (the default and
the ones the task made), and puts back what the task may have changed in the process:
environment, working directory, warnings filters, torch's global switches, the random
generators (fresh seeds, as a new process has), DTensor's caches of meshes (whose group
names die with the task's groups), the attributes of dmuon's Python modules and classes,
and the modules imported from the tests' folder (re-imported by the next task).
A task that fails, hangs or loses a rank ends the pool: its processes are killed and the
next task starts a new one, so that no failure reaches a later test.
"""

from __future__ import annotations

import atexit
import datetime
import faulthandler
import gc
import multiprocessing as mp
import os
import pickle
import queue as queue_module
import sys
import time
import traceback
from typing import Any, Callable

from dmuon.cli.launch import RankFailed, _free_port, _SAFE_ENV

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- inside a pooled rank
class _ProcessState:
    """What a task may change in a pooled rank's process, captured once and put back."""

    def __init__(self) -> None:
        import random
        import sys
        import warnings

        import numpy as np
        import torch

        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.sys_path = list(sys.path)
        self.warning_filters = list(warnings.filters)
        self.modules = set(sys.modules)
        self.num_threads = torch.get_num_threads()
        self.default_dtype = torch.get_default_dtype()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.anomaly = torch.is_anomaly_enabled()
        # NOTE: shallow copies of dmuon's Python modules and their classes: a test that patches
        # one of them (bench e2e's out-of-memory tests do) must not leave the patch behind.
        self.module_attrs = {name: dict(vars(m)) for name, m in sys.modules.items() if _is_dmuon_python(name, m)}
        self.class_attrs = {cls: dict(vars(cls)) for name in self.module_attrs
                            for cls in _classes_of(sys.modules[name])}
        self._random, self._np, self._warnings = random, np, warnings

    def restore(self) -> None:
        import sys

        import torch

        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.path[:] = self.sys_path
        self._warnings.filters[:] = self.warning_filters
        torch.set_num_threads(self.num_threads)
        torch.set_default_dtype(self.default_dtype)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.autograd.set_detect_anomaly(self.anomaly)
        torch.set_grad_enabled(True)
        for name in set(sys.modules) - self.modules:
            module = sys.modules.get(name)
            if _is_dmuon_python(name, module) or _from_tests_dir(module):
                del sys.modules[name]
        for name, attrs in self.module_attrs.items():
            _put_back(vars(sys.modules[name]), attrs, lambda k, v, m=sys.modules[name]: setattr(m, k, v),
                      lambda k, m=sys.modules[name]: delattr(m, k))
        for cls, attrs in self.class_attrs.items():
            _put_back(dict(vars(cls)), attrs, lambda k, v, c=cls: setattr(c, k, v), lambda k, c=cls: delattr(c, k))
        _clear_dtensor_caches()
        # NOTE: a failed task's objects (process groups held by runtimes) may sit in cycles.
        gc.collect()
        # Fresh seeds, as a new process gets (torch seeds itself from the OS there too).
        torch.seed()
        self._random.seed()
        self._np.random.seed()


def _clear_dtensor_caches() -> None:
    """Empties DTensor's process-wide caches whose keys or values hold DeviceMeshes.

    NOTE: why: a DeviceMesh compares and hashes by its ranks, layout, device type and dim
    names, not by its groups; the next task's equal mesh (same shape and names) hits the
    entries of this task's, and gets back specs whose mesh carries this task's group names
    (c10d's registry forgot them when the groups were destroyed): "Could not resolve the
    process group registered under the name 7". The C++ fast path's cache is the one
    that serves DTensor ops; the Python ones hold meshes too (sharding propagation, its
    tensor metadata, the redistribute planner, the mesh topology of the cost model)."""
    import torch

    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:
        clear_native()
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import _collective_utils, _redistribute, _sharding_prop
    except ImportError:  # NOTE: a torch without DTensor has none of these caches
        return
    propagator = DTensor._op_dispatcher.sharding_propagator
    for cached in (propagator.propagate_op_sharding, getattr(_sharding_prop.ShardingPropagator,
                                                             "_propagate_tensor_meta", None),
                   getattr(_redistribute, "_gen_transform_infos", None),
                   getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _is_dmuon_python(name: str, module: Any) -> bool:
    file = getattr(module, "__file__", None) or ""
    return (name == "dmuon" or name.startswith("dmuon.")) and file.endswith(".py")


def _from_tests_dir(module: Any) -> bool:
    file = getattr(module, "__file__", None) or ""
    return os.path.dirname(os.path.abspath(file)) == _TESTS_DIR if file else False


def _classes_of(module: Any) -> list[type]:
    return [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]


def _put_back(current: dict, saved: dict, set_attr: Callable, del_attr: Callable) -> None:
    for key in [k for k in current if k not in saved]:
        try:
            del_attr(key)
        except (AttributeError, TypeError):
            pass
    for key, value in saved.items():
        if current.get(key, _MISSING) is not value:
            try:
                set_attr(key, value)
            except (AttributeError, TypeError):
                pass


_MISSING = object()


def _serve(rank: int, size: int, port: int, tasks, results) -> None:
    """Pooled process `rank` of `size`: tasks (task_id, world, pickled (fn, args), collective
    timeout) until None; it is rank `rank` of each task's world."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), **_SAFE_ENV)
    # NOTE: a pooled process that dies of a signal prints every thread's Python stack.
    faulthandler.enable()
    import torch
    import torch.distributed as dist

    import dmuon  # noqa: F401 - imported once for every task (the point of the pool)

    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    state = _ProcessState()
    while True:
        message = tasks.get()
        if message is None:
            return
        task_id, world, payload, collective_timeout_s = message
        status = "init-error"
        try:
            # NOTE: what dmuon.cli.launch gives a rank of `world` processes.
            threads = max(1, (os.cpu_count() or 1) // world)
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS=str(threads))
            torch.set_num_threads(threads)
            fn, args = pickle.loads(payload)
            status = "init-error"
            dist.init_process_group("gloo", store=dist.PrefixStore(f"task{task_id}/", store), rank=rank,
                                    world_size=world, timeout=datetime.timedelta(seconds=collective_timeout_s))
            status = "error"
            results.put((task_id, rank, "ok", fn(rank, world, *args)))
        except BaseException:  # noqa: BLE001 - reported to the parent, which ends the pool
            results.put((task_id, rank, status, traceback.format_exc()))
        finally:
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()  # NOTE: every group, the task's own included
                except Exception:  # noqa: BLE001
                    pass
            state.restore()


# ---------------------------------------------------------------- the test process's side
class WorldNotFormed(RankFailed):
    """A task's process group could not be made (its function did not run on that rank)."""


# NOTE: how long the other ranks of a failed task may take to report: a pooled task is
# expected to pass, so its failure only needs the failing rank's message (a rank left in a
# collective would report only at its collective timeout, a minute by default).
_GRACE_AFTER_FAILURE_S = 5.0


class WorldPool:
    """`size` started Gloo processes (see the module's docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(size)]
        port = _free_port()
        self._procs = [ctx.Process(target=_serve, daemon=True, args=(r, size, port, self._tasks[r], self._results))
                       for r in range(size)]
        for p in self._procs:
            p.start()
        self._next_task = 0
        self.alive = True

    def run(self, fn: Callable, world: int, args: tuple, timeout_s: float,
            collective_timeout_s: float) -> dict[int, Any]:
        """fn(rank, world, *args) on the first `world` processes; {rank: result}. Raises
        RankFailed (the pool then ends) like dmuon.cli.launch.launch, and TimeoutError past
        `timeout_s`."""
        assert self.alive and 1 <= world <= self.size, (self.alive, world, self.size)
        task_id, self._next_task = self._next_task, self._next_task + 1
        payload = pickle.dumps((fn, args))
        for q in self._tasks[:world]:
            q.put((task_id, world, payload, collective_timeout_s))
        done: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        first_error_at = float("inf")
        not_formed = False
        try:
            while len(done) + len(errors) < world:
                if errors and time.monotonic() > first_error_at + _GRACE_AFTER_FAILURE_S:
                    # NOTE: the others may wait in a collective the failed rank left: their
                    # processes are killed with the pool below, their errors unknown.
                    for rank in set(range(world)) - set(done) - set(errors):
                        errors[rank] = f"rank {rank} was stopped {_GRACE_AFTER_FAILURE_S:.0f} s after a failure"
                    break
                try:
                    got_task, rank, status, result = self._results.get(timeout=0.5)
                    if got_task == task_id:
                        (done if status == "ok" else errors)[rank] = result
                        if status != "ok" and len(errors) == 1:
                            first_error_at = time.monotonic()
                        not_formed = not_formed or status == "init-error"
                    continue
                except queue_module.Empty:
                    pass
                for rank, p in enumerate(self._procs):
                    if p.exitcode is not None and rank not in done and rank not in errors:
                        if rank >= world:  # NOTE: an idle process died: the pool is not whole
                            raise RankFailed(f"pooled process {rank} exited with code {p.exitcode}")
                        errors[rank] = f"rank {rank} exited with code {p.exitcode} without reporting"
                        first_error_at = min(first_error_at, time.monotonic())
                if time.monotonic() > deadline:
                    raise TimeoutError(f"a {world}-rank run exceeded {timeout_s:.0f} s; ranks that finished: "
                                       f"{sorted(done)}, ranks that failed: {errors}")
        except BaseException:
            self.close(kill=True)
            raise
        if errors:
            self.close(kill=True)
            stopped = {r for r, e in errors.items() if e.endswith("after a failure")}
            first, *others = sorted(set(errors) - stopped) + sorted(stopped)
            # NOTE: the others' errors too: the lowest rank's is often a consequence (a peer
            # that closed its connection), the cause is then on another rank.
            also = "".join(f"\n(rank {r} failed too:\n{errors[r]})" for r in others)
            error_type = WorldNotFormed if not_formed else RankFailed
            raise error_type(f"rank {first} of {world} failed:\n{errors[first]}{also}")
        return done

    def close(self, kill: bool = False) -> None:
        """Ends the pool: asks the processes to stop and kills those that do not (all of them
        at once with `kill`: after a failure or a hang nothing of theirs is worth waiting for)."""
        if not self.alive:
            return
        self.alive = False
        if not kill:
            for q in self._tasks:
                try:
                    q.put(None)
                except Exception:  # noqa: BLE001
                    pass
            for p in self._procs:
                p.join(timeout=2)
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=5)


# NOTE: the largest world of the CPU suite: smaller worlds run on the first processes.
_POOL_SIZE = 4
_POOL: list[WorldPool] = []
_RETRIES: list[int] = []  # the world size of every task run again (tests of the harness)


def pooled_run(fn: Callable, world: int, args: tuple, timeout_s: float, collective_timeout_s: float) -> dict[int, Any]:
    """fn on the shared pool (started on first use, replaced after a failure or by a larger one)."""
    if _POOL and (not _POOL[0].alive or _POOL[0].size < world):
        _POOL.pop().close()
    if not _POOL:
        _POOL.append(WorldPool(max(_POOL_SIZE, world)))
    try:
        return _POOL[0].run(fn, world, args, timeout_s, collective_timeout_s)
    except WorldNotFormed as error:
        # NOTE: Gloo's connectFullMesh now and then fails with "Connection closed by peer" on
        # a loaded machine (seen once in some hundred pooled tasks); a task whose world did
        # not form runs once more on new processes (its function's own failures never do).
        print(f"dist_pool: the {world}-rank world did not form, retrying on new processes:\n{error}",
              file=sys.stderr)
        _RETRIES.append(world)
        _POOL.pop()
        _POOL.append(WorldPool(max(_POOL_SIZE, world)))
        return _POOL[0].run(fn, world, args, timeout_s, collective_timeout_s)


def num_retries() -> int:
    """How many tasks ran again because their world did not form."""
    return len(_RETRIES)


def pool_pids() -> list[int]:
    """The process ids of the live pool (empty when none): tests of the harness."""
    return [p.pid for p in _POOL[0]._procs] if _POOL and _POOL[0].alive else []


@atexit.register
def _close_all() -> None:
    for pool in _POOL:
        pool.close()
