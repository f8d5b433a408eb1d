"""Ranks of the in-step fault tests (test_step_faults.py): FSDP2 training on 3 Gloo ranks
whose last rank is killed (or stalls) inside step 2, and what the survivors see after."""

from __future__ import annotations

import copy
import os
import time

import torch
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from dmuon.torn_state import first_line
from dist_workers import TinyTransformer, _batches, _loss

# NOTE: the victim stalls past the survivors' collective timeout, then goes on.
STALL_S = 6.0


def killed_inside_step(rank: int, world: int, where: str, directory: str) -> dict:
    """Step 1 trains; in step 2 the last rank exits (os._exit) in `where` ("exchange": after
    its momentum was written, before its first forward all_to_all; "ns": before its first
    Newton–Schulz batch; both through DMUON_TEST_EXIT; "adamw": in the AdamW part) or
    stalls in the AdamW part ("stall"). A survivor reports its step-2 error, then what
    step(), state_dict() and dmuon.checkpoint.save raise, and whether load_state_dict of
    the state saved after step 1 makes the state whole again (no collective needed)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyTransformer()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model.qkv, model.proj, model.up, model.down):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    victim = rank == world - 1
    if victim and where in ("exchange", "ns"):
        os.environ["DMUON_TEST_EXIT"] = f"{where}@2"  # NOTE: read when the runtime is made (step 1)
    opt = dmuon.DMuon(model, lr=0.01)

    def train_step(step: int) -> None:
        opt.zero_grad()
        _loss(model, _batches(step, world)[2 * rank:2 * rank + 2]).backward()
        opt.step()

    train_step(0)
    saved = copy.deepcopy(opt.state_dict())
    if victim and where in ("adamw", "stall"):
        def broken(group, params):
            if where == "adamw":
                os._exit(17)
            time.sleep(STALL_S)
        opt._adamw_group_step = broken
    out: dict = {"ranks": world}
    try:
        train_step(1)
        out["step 2"] = "stepped"
    except Exception as error:  # noqa: BLE001 - reported to the test
        out["step 2"] = first_line(error)
    torn = opt.torn_step
    out["torn"] = None if torn is None else (torn.step_idx, torn.phase, torn.error)
    for name, call in (("step", opt.step), ("state_dict", opt.state_dict),
                       ("save", lambda: dmuon.checkpoint.save({"model": model.state_dict(), "optim": opt},
                                                              os.path.join(directory, "ckpt")))):
        try:
            call()
            out[name] = "no error"
        except Exception as error:  # noqa: BLE001 - reported to the test
            out[name] = first_line(error)
            # NOTE: TornStateError only where raised before any collective (one on the broken
            # world would raise Gloo's error instead).
            out[f"{name} class"] = type(error).__name__
    out["post-mortem keys"] = sorted(opt.state_dict(torn_ok=True)["state"]) == sorted(saved["state"])
    opt.load_state_dict(saved)
    out["whole after load"] = opt.torn_step is None and sorted(opt.state_dict()["state"]) == sorted(saved["state"])
    return out
