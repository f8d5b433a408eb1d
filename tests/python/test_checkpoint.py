"""Checkpoints through torch.distributed.checkpoint move across world sizes and wrappers:
save under FSDP2 at world 4 (or DDP), load at world 2, 3, 1 (or FSDP2), train 3 more
steps, and land on the uninterrupted trajectory (CPU fp32: within 1e-6 relative); at the
same world size resumed training is bitwise identical. The ownership plan is not saved:
every load recomputes it for the new world. Saves go through dmuon.checkpoint: a save killed
at any point leaves the previous checkpoint loadable, and a torn one is refused."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import dmuon
import dmuon.checkpoint
from dist_harness import run_distributed
from worker_tensors import whole_numpy


def max_relative_error(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.linalg.norm(a[n] - b[n]) / max(np.linalg.norm(b[n]), 1e-30)) for n in b)


def assert_every_rank_matches(resumed: dict, reference: dict, tolerance: float) -> None:
    """Every rank of the resumed run, parameters and whole optimizer state (momentum buffers,
    AdamW moments and step counts, group options and counters), against every rank of the
    uninterrupted run: within `tolerance` relative (0: bitwise)."""
    expected = reference[0]
    for rank, view in reference.items():  # the uninterrupted run's ranks agree with each other
        assert max_relative_error(view["params"], expected["params"]) == 0.0, rank
        assert max_relative_error(view["state"], expected["state"]) == 0.0, rank
    assert len(expected["state"]) >= len(expected["params"])  # every parameter has state
    for rank, view in resumed.items():
        for what in ("params", "state"):
            error = max_relative_error(view[what], expected[what])
            assert error <= tolerance, (rank, what, error)
        assert view["groups"] == expected["groups"], (rank, view["groups"], expected["groups"])


@pytest.fixture(scope="module")
def fsdp2_world4_checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt_fsdp2_w4"))
    reference = run_distributed(save_then_continue, 4, "fsdp2", path)
    return path, reference


@pytest.mark.parametrize("world, wrapper", [(4, "fsdp2"), (2, "fsdp2"), (3, "fsdp2"), (1, "none"), (2, "ddp")],
                         ids=["4-fsdp2-bitwise", "2-fsdp2", "3-fsdp2", "1-single", "2-ddp"])
def test_fsdp2_world4_checkpoint_resumes_anywhere(fsdp2_world4_checkpoint, world, wrapper):
    path, reference = fsdp2_world4_checkpoint
    resumed = run_distributed(load_then_continue, world, wrapper, path)
    # NOTE: the step itself is world-independent on the CPU (the same gradients give the
    # same bits at worlds 1, 2 and 4: StepNormuon.ShardedAndReplicatedMatchOneProcessBitwise,
    # and measured on this model); the gradients are not: FSDP2's mean of 3
    # ranks' gradients differs from one process's by 2–4e-8 relative, and FSDP2's LayerNorm
    # and last layer by 3–9e-8 at any world, which Newton–Schulz amplifies to 1.47e-6 on the
    # parameters at world 3 (6.3e-7 at world 1). World 2 averages like world 4: bitwise.
    assert_every_rank_matches(resumed, reference, 0.0 if world in (4, 2) and wrapper == "fsdp2" else 3e-6)


def test_ddp_checkpoint_resumes_under_fsdp2(tmp_path):
    path = str(tmp_path / "ckpt_ddp")
    reference = run_distributed(save_then_continue, 2, "ddp", path)
    resumed = run_distributed(load_then_continue, 2, "fsdp2", path)
    assert_every_rank_matches(resumed, reference, 1e-6)


def test_full_state_dict_with_cpu_offload_round_trip(tmp_path):
    path = str(tmp_path / "full.pt")
    reference = run_distributed(save_then_continue, 2, "fsdp2", path, True)
    resumed = run_distributed(load_then_continue, 2, "fsdp2", path, True)
    assert_every_rank_matches(resumed, reference, 1e-6)


# A save killed at each point of dmuon.checkpoint.save (a child process, SIGKILL): inside
# DCP's write (data files written, DCP's metadata not), before the marker, between the two
# renames. Catches: a save into the checkpoint's own directory (it would load torn), the
# marker written before DCP finished or not checked at load, the previous checkpoint
# removed before the new one is in place.
_KILLED_SAVE = """
import os, signal, sys
import torch
import torch.distributed.checkpoint.filesystem as fs
import dmuon.checkpoint as ckpt

directory, where = sys.argv[1], sys.argv[2]
ckpt.save({"w": torch.full((64, 64), 1.0), "step": torch.tensor(1)}, directory)

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def half_swap(staging, directory, previous):
    os.rename(directory, previous)
    die()

if where == "in-dcp":
    fs.FileSystemWriter.finish = die
elif where == "before-marker":
    ckpt._mark_complete = die
else:
    ckpt._swap_in = half_swap
ckpt.save({"w": torch.full((64, 64), 2.0), "step": torch.tensor(2)}, directory)
"""


def _loaded(directory) -> tuple[float, int]:
    state = {"w": torch.zeros(64, 64), "step": torch.tensor(0)}
    dmuon.checkpoint.load(state, directory)
    assert torch.all(state["w"] == state["w"][0, 0])  # whole, never mixed
    return float(state["w"][0, 0]), int(state["step"])


@pytest.mark.parametrize("where", ["in-dcp", "before-marker", "between-renames"])
def test_a_killed_save_keeps_the_previous_checkpoint_and_its_torn_one_is_refused(tmp_path, where):
    directory = tmp_path / "ckpt"
    child = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(directory), where], capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert dmuon.checkpoint.found(directory)  # at <directory>.previous after the first rename
    assert _loaded(directory) == (1.0, 1)
    staging = tmp_path / "ckpt.saving"
    if where != "between-renames":
        assert staging.is_dir()
        with pytest.raises(dmuon.checkpoint.CheckpointError, match="ckpt.saving is not a complete checkpoint: no"):
            _loaded(staging)
    # The next save replaces it whole, whatever the killed one left.
    dmuon.checkpoint.save({"w": torch.full((64, 64), 3.0), "step": torch.tensor(3)}, directory)
    assert _loaded(directory) == (3.0, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_torn_foreign_and_missing_checkpoints_are_refused_with_a_catchable_error(tmp_path):
    directory = tmp_path / "ckpt"
    dmuon.checkpoint.save({"w": torch.ones(8)}, directory)
    data = next(p for p in directory.iterdir() if p.suffix == ".distcp")
    data.write_bytes(data.read_bytes()[:-1])  # a copy cut short
    with pytest.raises(Exception, match=f"{data.name} holds .* bytes, the save wrote"):
        _loaded(directory)
    raw = tmp_path / "raw"  # saved by DCP alone: nothing says it is complete
    dcp.save({"w": torch.ones(8)}, checkpoint_id=str(raw))
    with pytest.raises(dmuon.checkpoint.CheckpointError, match="no dmuon_checkpoint.json"):
        _loaded(raw)
    assert not dmuon.checkpoint.found(tmp_path / "missing")
    with pytest.raises(dmuon.checkpoint.CheckpointError, match="no such directory"):
        _loaded(tmp_path / "missing")
    # Nor is a directory of other files replaced by a save.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(dmuon.checkpoint.CheckpointError, match="no complete dmuon checkpoint.*not replacing it"):
        dmuon.checkpoint.save({"w": torch.ones(8)}, other)
    assert (other / "notes.txt").read_text() == "mine"


def test_a_tensor_over_freed_storage_is_refused_by_name_and_nothing_is_written(tmp_path):
    # Catches: DCP handed a tensor whose memory was freed (it crashed the process); an
    # expanded view (a storage smaller than its elements) or an empty tensor taken for one.
    from dmuon import _C

    freed = torch.ones(4, 4)
    _C.ownership.free_storage(freed)
    fine = {"view": torch.zeros(1).expand(10), "empty": torch.zeros(0), "w": torch.ones(3)}
    dmuon.checkpoint.save(fine, tmp_path / "fine")
    with pytest.raises(dmuon.checkpoint.CheckpointError,
                       match=r"state\['model'\]\['w'\] holds no memory on this rank.*owned.materialized"):
        dmuon.checkpoint.save({"model": {"w": freed}}, tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fine"]


# ---------------------------------------------------------------- on the ranks
# Train a small model under FSDP2, DDP or on one process, save or load through
# dmuon.checkpoint (torch.distributed.checkpoint into a directory swapped in whole), and
# continue training.


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 16),
                         nn.LayerNorm(16), nn.Linear(16, 10, bias=False))


def wrap(model: nn.Module, wrapper: str, world: int) -> nn.Module:
    """FSDP2 on every layer with parameters, DDP, or nothing ("none")."""
    if wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if wrapper == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    return model


def train(model: nn.Module, opt: torch.optim.Optimizer, first_step: int, num_steps: int) -> None:
    """The same global batches at every world size (data parallel: the mean loss)."""
    for step in range(first_step, first_step + num_steps):
        tokens = torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(tokens).pow(2).mean().backward()
        opt.step()


def snapshot(model: nn.Module, opt: torch.optim.Optimizer | None = None) -> dict:
    """This rank's view, whole (numpy: results travel between processes by value): every
    parameter ("params"), and with `opt` every state entry of every parameter ("state",
    by parameter and key) and the param groups' options ("groups")."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    out = {"params": {name.removeprefix("module."): whole_numpy(p) for name, p in model.named_parameters()}}
    if opt is not None:
        _, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
        out["state"] = {f"{str(fqn).removeprefix('module.')}.{key}": whole_numpy(value) if torch.is_tensor(value) else value
                        for fqn, entries in osd["state"].items() for key, value in entries.items()}
        # NOTE: a full state dict's load gives tuples back as lists (betas): compared as lists.
        out["groups"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items() if k != "params"}
                         for g in osd["param_groups"]]
    return out


def _state(model, opt, full: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=full, cpu_offload=full)
    return get_state_dict(model, opt, options=options)


def save_then_continue(rank: int, world: int, wrapper: str, path: str, full: bool = False,
                       extra: dict | None = None) -> dict:
    """3 steps, checkpoint, 3 more steps: the uninterrupted trajectory. `extra`: more DMuon
    options (e.g. normuon=True; the load takes them from the checkpoint)."""
    model = wrap(make_model(), wrapper, world)
    opt = dmuon.DMuon(model, lr=0.02, weight_decay=0.1, **(extra or {}))
    train(model, opt, 0, 3)
    msd, osd = _state(model, opt, full)
    if full:
        if rank == 0:
            torch.save({"model": msd, "optim": osd}, path)
    else:
        dmuon.checkpoint.save({"model": msd, "optim": osd}, path)
    train(model, opt, 3, 3)
    return snapshot(model, opt)


def load_then_continue(rank: int, world: int, wrapper: str, path: str, full: bool = False,
                       extra: dict | None = None) -> dict:
    """A fresh model and optimizer, the checkpoint loaded, 3 more steps. `extra`: options the
    optimizer is made with. NOTE: DCP loads the state keys the fresh optimizer's state dict
    has (torch initializes it by a zero step), so an option that adds state (normuon) must be
    given, as a training script would; lr and weight decay come from the checkpoint."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    model = wrap(make_model(), wrapper, world)
    opt = dmuon.DMuon(model, lr=0.5, weight_decay=0.0, **(extra or {}))  # options come back from the checkpoint
    if full:
        state = torch.load(path, weights_only=False)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(full_state_dict=True))
    else:
        msd, osd = _state(model, opt, False)
        state = {"model": msd, "optim": osd}
        dmuon.checkpoint.load(state, path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert opt.param_groups[0]["lr"] == 0.02 and opt.param_groups[0]["weight_decay"] == 0.1
    dist.barrier()
    train(model, opt, 3, 3)
    return snapshot(model, opt)
