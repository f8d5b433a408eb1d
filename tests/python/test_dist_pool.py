"""The pool of started Gloo processes behind run_distributed (dist_pool.py): tasks reuse
processes, see a fresh world of their size and nothing an earlier task left, and a task that
fails or hangs ends the pool so that the next task runs on new processes."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import dist_pool
import dist_workers
import dmuon.cli.launch
from dist_harness import run_distributed

def test_tasks_of_any_world_size_reuse_the_started_processes():
    for world in (2, 1, 3, 2, 4):
        pids, retries = dist_pool.pool_pids(), dist_pool.num_retries()
        again = run_distributed(identity, world)
        assert sorted(again) == list(range(world))
        for rank, r in again.items():
            assert r["rank"] == rank and r["world"] == world and r["pid"] == dist_pool.pool_pids()[rank], (world, r)
            assert r["threads"] == max(1, (os.cpu_count() or 1) // world)  # as dmuon.cli.launch gives
        # NOTE: the same processes as the task before, unless this task's world had to be made
        # again on new ones (dist_pool.pooled_run's retry).
        if pids and dist_pool.num_retries() == retries:
            assert dist_pool.pool_pids() == pids, world


def test_a_task_finds_nothing_an_earlier_task_left():
    # NOTE: the check needs the second task on the first one's processes; a world that had to
    # be made again on new processes (dist_pool.pooled_run's retry, seen on a loaded machine)
    # proves nothing, so the pair runs again.
    for _ in range(3):
        retries = dist_pool.num_retries()
        left = run_distributed(leave_state_behind, 3)
        found = run_distributed(what_was_left, 3)
        if dist_pool.num_retries() == retries:
            break
    else:
        pytest.fail("the 3-rank world had to be made again in each of 3 tries")
    for rank, r in found.items():
        assert r["pid"] == left[rank], rank  # the same process, cleaned
        assert r == {"pid": left[rank], "env": None, "cwd": os.getcwd(), "dtype": "torch.float32", "grad": True,
                     "seeded": False, "resolve_device": True, "own_groups": 0, "groups": 1}, (rank, r)


def test_a_2d_mesh_of_an_earlier_task_leaves_no_group_names_behind():
    # NOTE: the earlier task's extra groups give its mesh other group names than the next
    # task's equal mesh gets; a cache of the earlier mesh reaching the next task fails there
    # with "Could not resolve the process group registered under the name …".
    first = run_distributed(dtensor_op_on_a_2d_mesh, 4, 3)
    second = run_distributed(dtensor_op_on_a_2d_mesh, 4, 0)
    assert first == second == {rank: 240.0 for rank in range(4)}


@pytest.mark.slow
def test_a_failed_task_ends_the_pool_and_the_next_task_gets_new_processes():
    before = run_distributed(identity, 2)
    with pytest.raises(AssertionError, match="of 2 failed:(.|\n)*rank 1 fails on purpose"):
        run_distributed(fail_on_last_rank, 2, collective_timeout_s=5)
    assert dist_pool.pool_pids() == []
    after = run_distributed(identity, 2)
    assert {r["pid"] for r in after.values()}.isdisjoint(r["pid"] for r in before.values())


@pytest.mark.slow
def test_a_process_that_died_after_its_task_fails_the_next_task_never_retried():
    # NOTE: its peers cannot connect to it, as when Gloo's connect fails on a loaded
    # machine; that one is retried on new processes, a dead process is a failure.
    run_distributed(die_in_teardown, 2)
    retries = dist_pool.num_retries()
    with pytest.raises(AssertionError, match="of 2 failed:(.|\n)*rank 0 exited with code -9"):
        run_distributed(identity, 2)
    assert dist_pool.num_retries() == retries


@pytest.mark.slow
def test_a_hung_task_is_stopped_at_its_deadline_and_replaced():
    before = run_distributed(identity, 1)
    with pytest.raises(TimeoutError, match="exceeded 3 s"):
        run_distributed(hang, 1, timeout_s=3)
    after = run_distributed(identity, 1)
    assert {r["pid"] for r in after.values()}.isdisjoint(r["pid"] for r in before.values())


@pytest.mark.slow
def test_a_changed_environment_or_fresh_gets_processes_of_its_own(monkeypatch):
    pooled = set(dist_pool.pool_pids()) | {r["pid"] for r in run_distributed(identity, 1).values()}
    assert {r["pid"] for r in run_distributed(identity, 1, fresh=True).values()}.isdisjoint(pooled)
    monkeypatch.setenv("DMUON_PIPELINE_DEPTH", "1")
    assert {r["pid"] for r in run_distributed(identity, 1).values()}.isdisjoint(pooled)


# ---------------------------------------------------------------- on the ranks
def identity(rank: int, world: int) -> dict:
    """Who ran this: the process, the world it saw, its threads."""
    return {"pid": os.getpid(), "rank": dist.get_rank(), "world": dist.get_world_size(),
            "threads": torch.get_num_threads()}


def leave_state_behind(rank: int, world: int) -> int:
    """Changes everything a careless task could: environment, cwd, torch's switches and
    seed, a dmuon module attribute, a test module's cache of groups, extra groups."""
    os.environ["DMUON_LEFT_BEHIND"] = "1"
    os.chdir("/")
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.manual_seed(1234)
    dmuon.cli.launch.resolve_device = None
    dist_workers._own_group()
    dist.new_group(list(range(world)))
    return os.getpid()


def what_was_left(rank: int, world: int) -> dict:
    """What a later task finds of leave_state_behind's changes."""
    from torch.distributed import distributed_c10d

    return {"pid": os.getpid(), "env": os.environ.get("DMUON_LEFT_BEHIND"), "cwd": os.getcwd(),
            "dtype": str(torch.get_default_dtype()), "grad": torch.is_grad_enabled(),
            "seeded": torch.initial_seed() == 1234, "resolve_device": dmuon.cli.launch.resolve_device is not None,
            "own_groups": len(dist_workers._OWN_GROUPS), "groups": len(distributed_c10d._world.pg_map)}


def fail_on_last_rank(rank: int, world: int) -> str:
    if rank == world - 1:
        raise RuntimeError(f"rank {rank} fails on purpose")
    dist.barrier()  # NOTE: left waiting for the failed rank until the collective timeout
    return "no error"


def hang(rank: int, world: int) -> str:
    time.sleep(60)
    return "woke up"


def dtensor_op_on_a_2d_mesh(rank: int, world: int, extra_groups: int) -> float:
    """A DTensor op on a 2×(world/2) mesh with fixed dim names, after `extra_groups` new
    groups (they shift the names of the mesh's groups); the sum of the op's full result."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    for _ in range(extra_groups):
        dist.new_group(list(range(world)))
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pool_dp", "pool_tp"))
    t = distribute_tensor(torch.arange(16.0).reshape(4, 4), mesh, [Shard(0), Shard(1)])
    # NOTE: the product's spec (its mesh included) comes from DTensor's sharding propagation
    # cache; an equal mesh of an earlier task (DeviceMesh compares by ranks and dim names,
    # not by groups) would carry that task's group names, unresolvable now.
    return (t * 2).full_tensor().sum().item()


class _KillsItsProcess:
    """Kills its process by a signal when the garbage collector frees it (a crash in a
    task's teardown: dist_pool's restore() collects what the task left in cycles)."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def die_in_teardown(rank: int, world: int) -> int:
    """Reports, then rank 0's process dies of SIGKILL in the task's teardown."""
    if rank == 0:
        _KillsItsProcess()
    return os.getpid()
