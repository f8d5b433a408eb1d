"""Rank functions of the pool harness's own tests (test_dist_pool.py)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import dist_workers
import dmuon.cli.launch


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
