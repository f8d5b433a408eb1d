"""The pool of started Gloo processes behind run_distributed (dist_pool.py): tasks reuse
processes, see a fresh world of their size and nothing an earlier task left, and a task that
fails or hangs ends the pool so that the next task runs on new processes."""

from __future__ import annotations

import os

import pytest

import dist_pool
import pool_workers
from dist_harness import run_distributed


def test_tasks_of_any_world_size_reuse_the_started_processes():
    for world in (2, 1, 3, 2, 4):
        pids, retries = dist_pool.pool_pids(), dist_pool.num_retries()
        again = run_distributed(pool_workers.identity, world)
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
        left = run_distributed(pool_workers.leave_state_behind, 3)
        found = run_distributed(pool_workers.what_was_left, 3)
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
    first = run_distributed(pool_workers.dtensor_op_on_a_2d_mesh, 4, 3)
    second = run_distributed(pool_workers.dtensor_op_on_a_2d_mesh, 4, 0)
    assert first == second == {rank: 240.0 for rank in range(4)}


@pytest.mark.slow
def test_a_failed_task_ends_the_pool_and_the_next_task_gets_new_processes():
    before = run_distributed(pool_workers.identity, 2)
    with pytest.raises(AssertionError, match="of 2 failed:(.|\n)*rank 1 fails on purpose"):
        run_distributed(pool_workers.fail_on_last_rank, 2, collective_timeout_s=5)
    assert dist_pool.pool_pids() == []
    after = run_distributed(pool_workers.identity, 2)
    assert {r["pid"] for r in after.values()}.isdisjoint(r["pid"] for r in before.values())


@pytest.mark.slow
def test_a_process_that_died_after_its_task_fails_the_next_task_never_retried():
    # NOTE: its peers cannot connect to it, as when Gloo's connect fails on a loaded
    # machine; that one is retried on new processes, a dead process is a failure.
    run_distributed(pool_workers.die_in_teardown, 2)
    retries = dist_pool.num_retries()
    with pytest.raises(AssertionError, match="of 2 failed:(.|\n)*rank 0 exited with code -9"):
        run_distributed(pool_workers.identity, 2)
    assert dist_pool.num_retries() == retries


@pytest.mark.slow
def test_a_hung_task_is_stopped_at_its_deadline_and_replaced():
    before = run_distributed(pool_workers.identity, 1)
    with pytest.raises(TimeoutError, match="exceeded 3 s"):
        run_distributed(pool_workers.hang, 1, timeout_s=3)
    after = run_distributed(pool_workers.identity, 1)
    assert {r["pid"] for r in after.values()}.isdisjoint(r["pid"] for r in before.values())


@pytest.mark.slow
def test_a_changed_environment_or_fresh_gets_processes_of_its_own(monkeypatch):
    pooled = set(dist_pool.pool_pids()) | {r["pid"] for r in run_distributed(pool_workers.identity, 1).values()}
    assert {r["pid"] for r in run_distributed(pool_workers.identity, 1, fresh=True).values()}.isdisjoint(pooled)
    monkeypatch.setenv("DMUON_PIPELINE_DEPTH", "1")
    assert {r["pid"] for r in run_distributed(pool_workers.identity, 1).values()}.isdisjoint(pooled)
