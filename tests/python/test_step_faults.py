"""A rank lost inside a step: the survivors raise naming the step and the collective, and
where they had begun writing, their optimizer refuses to go on from a state that may be torn
(dmuon.torn_state) until a checkpoint is loaded. A step that fails before it writes leaves
nothing to refuse (test_atomic_failures, test_distributed's NaN/Inf and start-agreement
tests, and the weight-ownership cases below).

3 Gloo ranks (killed_inside_step below); in step 2 the last rank exits, or stalls past a 3 s
collective timeout, in one of the places its mode's step can lose it:
- FSDP2 (sharded): in the forward exchange (its momentum written), in Newton–Schulz (both
  through DMUON_TEST_EXIT, a test hook of the engine), in the AdamW part, a stall there;
- weight ownership (dmuon.own_matrices): while forward publishes the owned weights, while
  backward reduces the gradient buckets to their owners, in its owned matrices'
  Newton–Schulz (DMUON_TEST_EXIT; begun inside backward or at step()), in the AdamW part, a
  stall there. Its owners write nothing before the step's start agreement, so a rank lost
  before it leaves every survivor's state as step 1 left it."""

from __future__ import annotations

import copy
import os
import re
import time

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._pytree import tree_flatten

import dmuon
from contract_models import TinyDecoder
from dist_harness import run_distributed
from dist_workers import TinyTransformer, _batches, _loss
from dmuon.distributed import local
from dmuon.torn_state import first_line

# Where each fault makes the survivors fail: the collective their error names.
_STAGE = r"all_to_all of stage \d+'s (pieces to their owners|results back from their owners) \(step 2\) failed"
_RESULTS = r"all_reduce of the result flags \(step 2\) failed"
# NOTE: the weight-ownership mode's collectives of step 2 before its start agreement
# (forward's and backward's publishes, backward's reductions, the unowned parameters'
# averaging): a survivor's error names whichever it waited on first.
_OWNED_BEFORE_START = (r"(broadcast of \w+\.weight from its owner|all_to_all of bucket \d+'s gradients to their "
                       r"owners along the row|all_reduce of the unowned parameters' gradients|"
                       r"all_reduce of the start agreement) \(step 2\) failed")
# (mode, where): the survivors' error, and the phase their torn state names (None: whole).
CASES = {
    ("fsdp2", "exchange"): (_STAGE, "the Muon part"),
    ("fsdp2", "ns"): (_STAGE, "the Muon part"),
    ("fsdp2", "adamw"): (_RESULTS, "the result agreement"),
    ("fsdp2", "stall"): (_RESULTS, "the result agreement"),
    ("ownership", "publish"): (r"broadcast of \w+\.weight from its owner \(step 2\) failed", None),
    ("ownership", "reduce"): (_OWNED_BEFORE_START, None),
    ("ownership", "ns"): (_OWNED_BEFORE_START, None),
    ("ownership", "adamw"): (_RESULTS, "the result agreement"),
    ("ownership", "stall"): (_RESULTS, "the result agreement"),
}


@pytest.mark.parametrize("mode,where", CASES, ids=[f"{mode}-{where}" for mode, where in CASES])
def test_a_rank_lost_inside_step_leaves_every_survivor_whole_or_refusing_its_torn_state(mode, where, tmp_path):
    # Catches: a survivor that hangs, or raises naming neither the step nor the collective;
    # one that steps on (or saves, or hands out) momentum and weights that one failed step
    # left half-written; a refusal where nothing was written; a poison that a reload does
    # not clear.
    results = run_distributed(killed_inside_step, 3, mode, where, str(tmp_path), expect_errors=True,
                              timeout_s=180, collective_timeout_s=3)
    if where != "stall":
        assert "exited with code 17" in str(results[2]), results[2]
    survivor_error, torn_phase = CASES[mode, where]
    for rank in (0, 1):
        out = results[rank]
        assert isinstance(out, dict), f"rank {rank}:\n{out}"
        assert re.search(survivor_error, out["step 2"]), (rank, out)
        if torn_phase is None:
            assert out["torn"] is None and out["unchanged"] and out["state_dict"] == "no error", (rank, out)
        else:
            assert out["torn"] is not None, (rank, out)
            step_idx, phase, error = out["torn"]
            assert step_idx == 2 and phase.startswith(torn_phase) and "step 2" in error, (rank, out)
            assert not out["unchanged"], (rank, out)  # this rank did write: no false alarm
            for name in ("step", "state_dict", "save"):
                assert out[f"{name} class"] == "TornStateError", (rank, name, out)
                assert "may be torn: step 2 failed in " + torn_phase in out[name], (rank, name, out)
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
# Training on 3 Gloo ranks whose last rank is killed (or stalls) inside step 2, and what the
# survivors see after.
# NOTE: the victim stalls past the survivors' collective timeout, then goes on.
STALL_S = 6.0


def _same_state(a: dict, b: dict) -> bool:
    """Whether two optimizer state dicts hold the same state, bitwise (this rank's part)."""
    (leaves_a, spec_a), (leaves_b, spec_b) = tree_flatten(a["state"]), tree_flatten(b["state"])
    return spec_a == spec_b and all(
        torch.equal(local(x), local(y)) if isinstance(x, torch.Tensor) else x == y for x, y in zip(leaves_a, leaves_b))


def killed_inside_step(rank: int, world: int, mode: str, where: str, directory: str) -> dict:
    """Step 1 trains (mode "fsdp2": FSDP2; "ownership": dmuon.own_matrices, one bucket per
    matrix, plain DP for the rest); in step 2 the last rank exits (os._exit, code 17) in
    `where`: "exchange" (after its momentum was written, before its first forward all_to_all)
    or "ns" (before its first Newton–Schulz batch), both through DMUON_TEST_EXIT; "publish"
    (forward, before a module's owned weight is published), "reduce" (backward, between its
    buckets' reductions), "adamw" (the AdamW part); or it stalls in the AdamW part ("stall").
    A survivor reports its step-2 error, whether its state is still step 1's, what step(),
    state_dict() and dmuon.checkpoint.save raise (where torn; else state_dict() alone: any
    other call would be a collective on the broken world), and whether load_state_dict of the
    state saved after step 1 makes the state whole again (no collective needed)."""
    torch.manual_seed(0)
    model = TinyTransformer()
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in (model.qkv, model.proj, model.up, model.down):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        dmuon.own_matrices(model, bucket_size_mb=0.001, replicate_others=True)
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
    if victim:
        def exit_now(*args):
            os._exit(17)
        if where == "publish":
            model.up.register_forward_pre_hook(exit_now, prepend=True)
        elif where == "reduce":
            model.up.register_full_backward_hook(exit_now)
        elif where in ("adamw", "stall"):
            opt._adamw_group_step = exit_now if where == "adamw" else lambda group, params: time.sleep(STALL_S)
    out: dict = {"ranks": world}
    try:
        train_step(1)
        out["step 2"] = "stepped"
    except Exception as error:  # noqa: BLE001 - reported to the test
        out["step 2"] = first_line(error)
    torn = opt.torn_step
    out["torn"] = None if torn is None else (torn.step_idx, torn.phase, torn.error)
    out["unchanged"] = _same_state(opt.state_dict(torn_ok=True), saved)
    calls = [("state_dict", opt.state_dict)]
    if torn is not None:
        calls += [("step", opt.step),
                  ("save", lambda: dmuon.checkpoint.save({"model": model.state_dict(), "optim": opt},
                                                         os.path.join(directory, "ckpt")))]
    for name, call in calls:
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
