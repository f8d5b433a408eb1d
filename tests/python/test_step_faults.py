"""A rank lost inside step(): the survivors raise naming the step and the collective, and
their optimizer refuses to go on from a state that may be torn (dmuon.torn_state) until a
checkpoint is loaded. A step that fails before it writes leaves nothing to refuse
(test_atomic_failures, test_distributed's NaN/Inf and start-agreement tests).

3 Gloo ranks, FSDP2 (killed_inside_step below): the last rank exits in the forward
exchange (its momentum written), in Newton–Schulz (DMUON_TEST_EXIT, a test hook of the
engine) or in the AdamW part, or stalls there past a 3 s collective timeout."""

from __future__ import annotations

import copy
import os
import re
import time

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from contract_models import TinyDecoder
from dist_harness import run_distributed
from dist_workers import TinyTransformer, _batches, _loss
from dmuon.torn_state import first_line

# Where each fault makes the survivors fail: the collective their error names.
SURVIVOR_ERRORS = {
    "exchange": r"all_to_all of stage \d+'s (pieces to their owners|results back from their owners) \(step 2\) failed",
    "ns": r"all_to_all of stage \d+'s (pieces to their owners|results back from their owners) \(step 2\) failed",
    "adamw": r"all_reduce of the result flags \(step 2\) failed",
    "stall": r"all_reduce of the result flags \(step 2\) failed",
}
TORN_PHASE = {"exchange": "the Muon part", "ns": "the Muon part", "adamw": "the result agreement",
              "stall": "the result agreement"}


@pytest.mark.parametrize("where", ["exchange", "ns", "adamw", "stall"])
def test_a_rank_lost_inside_step_leaves_every_survivor_refusing_its_torn_state(where, tmp_path):
    # Catches: a survivor that steps on (or saves, or hands out) momentum and weights that
    # one failed step left half-written; a poison that a reload does not clear.
    results = run_distributed(killed_inside_step, 3, where, str(tmp_path), expect_errors=True,
                              timeout_s=180, collective_timeout_s=3)
    if where != "stall":
        assert "exited with code 17" in str(results[2]), results[2]
    for rank in (0, 1):
        out = results[rank]
        assert isinstance(out, dict), f"rank {rank}:\n{out}"
        assert re.search(SURVIVOR_ERRORS[where], out["step 2"]), (rank, out)
        step_idx, phase, error = out["torn"]
        assert step_idx == 2 and phase.startswith(TORN_PHASE[where]) and "step 2" in error, (rank, out)
        for name in ("step", "state_dict", "save"):
            assert out[f"{name} class"] == "TornStateError", (rank, name, out)
            assert "may be torn: step 2 failed in " + TORN_PHASE[where] in out[name], (rank, name, out)
            assert "load_state_dict" in out[name] and "torn_ok=True" in out[name], (rank, name, out)
        assert out["post-mortem keys"] and out["whole after load"], (rank, out)
    assert not list(tmp_path.iterdir()), "a refused save wrote nothing"


def _twins():
    """Two equal models and optimizers, each stepped once on the same gradients."""
    torch.manual_seed(0)
    model = TinyDecoder()
    twin = copy.deepcopy(model)
    pairs = [(model, dmuon.DMuon(model, lr=0.02)), (twin, dmuon.DMuon(twin, lr=0.02))]
    return pairs


def _set_grads(models, seed):
    gen = torch.Generator().manual_seed(seed)
    grads = {n: torch.randn(p.shape, generator=gen) for n, p in models[0].named_parameters()}
    for m in models:
        for n, p in m.named_parameters():
            p.grad = grads[n].clone()


def test_a_step_failing_after_it_began_writing_is_refused_until_a_checkpoint_is_loaded(tmp_path):
    # One process: the AdamW part raises after the Muon part wrote. Catches: a state that
    # steps on, saves or is handed out after it; an error that names neither the step nor
    # what to do; a reload that does not make it whole, or leaves anything of it behind
    # (the next step must be bitwise the twin's, which never failed).
    (model, opt), (twin, twin_opt) = _twins()
    _set_grads([model, twin], 1)
    opt.step()
    twin_opt.step()
    saved_opt = copy.deepcopy(opt.state_dict())
    saved_model = copy.deepcopy(model.state_dict())

    _set_grads([model], 2)
    opt._adamw_group_step = lambda group, params: (_ for _ in ()).throw(RuntimeError("AdamW broke\nsecond line"))
    with pytest.raises(RuntimeError, match="AdamW broke"):
        opt.step()
    del opt._adamw_group_step
    assert opt.torn_step.step_idx == 2 and opt.torn_step.phase == "the AdamW part"
    assert opt.torn_step.error == "RuntimeError: AdamW broke"
    expected = (r"may be torn: step 2 failed in the AdamW part after this rank began writing momentum and "
                r"parameters \(RuntimeError: AdamW broke\)\. Only reloading the last checkpoint")
    with pytest.raises(dmuon.TornStateError, match=r"step\(\) refused: .*" + expected):
        opt.step()
    with pytest.raises(dmuon.TornStateError, match=r"state_dict\(\) refused: .*" + expected):
        opt.state_dict()
    with pytest.raises(dmuon.TornStateError, match=r"dmuon.checkpoint.save refused: .*" + expected):
        dmuon.checkpoint.save({"model": model.state_dict()}, tmp_path / "ckpt")  # the model's tensors are torn too
    with pytest.raises(dmuon.TornStateError):
        dmuon.checkpoint.save({"optim": opt}, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
    # A post-mortem reads it anyway.
    assert opt.state_dict(torn_ok=True)["state"].keys() == saved_opt["state"].keys()
    dmuon.checkpoint.save({"optim": opt.state_dict(torn_ok=True)}, tmp_path / "post-mortem", torn_ok=True)

    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)
    assert opt.torn_step is None
    _set_grads([model, twin], 3)
    opt.step()
    twin_opt.step()
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), n


def test_a_step_refused_before_it_writes_leaves_the_state_whole():
    # Catches: a poison on a failure before any write (a NaN gradient, a bad option): the
    # next good step must run.
    (model, opt), _ = _twins()
    _set_grads([model], 1)
    model.up_proj.weight.grad[0, 0] = float("nan")
    with pytest.raises(dmuon.NonFiniteGradientError):
        opt.step()
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(RuntimeError, match="lr"):
        opt.step()
    opt.param_groups[0]["lr"] = 0.02
    assert opt.torn_step is None
    _set_grads([model], 2)
    opt.step()
    opt.state_dict()


# ---------------------------------------------------------------- on the ranks
# FSDP2 training on 3 Gloo ranks whose last rank is killed (or stalls) inside step 2, and
# what the survivors see after.
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
