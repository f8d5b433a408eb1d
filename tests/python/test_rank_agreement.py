"""What the ranks must agree on raises on every rank, with a name, instead of hanging or
training wrongly: replicas that differ, param groups added on some ranks only, one rank's
failed checks, an AdamW gradient on some ranks only."""

from __future__ import annotations

import copy

import torch
from torch import nn

import dmuon
from contract_models import TinyDecoder
from dist_harness import run_distributed
from worker_tensors import reference_of

def test_replicas_that_differ_are_refused_and_local_trains_each_rank_alone():
    results = run_distributed(replicas_that_differ_are_refused, 2)
    for rank, out in results.items():
        assert "'embed_tokens.weight'" not in out["error"]  # AdamW parameters are not replicas DMuon syncs
        assert "parameter 'q_proj.weight' differs across the 2 ranks" in out["error"], out["error"]
        assert "process_group='local'" in out["error"] and "DDP" in out["error"]
        assert out["runtime_world"] == 1
        assert out["max_error"] < 1e-5, (rank, out["max_error"])


def test_equal_replicas_pass_the_check():
    assert run_distributed(equal_replicas_pass, 2) == {0: 2, 1: 2}


def test_add_param_group_on_some_ranks_raises_on_every_rank_naming_the_group():
    results = run_distributed(add_param_group_on_some_ranks, 2)
    for rank, out in results.items():
        assert "param group 2 (Muon, 1 parameter(s), first 'extra.weight' (8, 8)) exists on rank(s) [0] but not " \
               "on rank(s) [1]" in out["error"], (rank, out["error"])
        assert "add_param_group" in out["error"]
        assert out["unchanged"]


def test_an_adamw_gradient_on_some_ranks_only_raises_on_every_rank_naming_it():
    results = run_distributed(adamw_gradient_on_some_ranks_only, 2)
    for rank, out in results.items():
        assert out["adamw"], rank
        assert "parameter 'embed_tokens.weight' (checked with the step) has a gradient on 1 of 2 ranks at step 1; " \
               "every rank must have it or none" in out["error"], (rank, out["error"])
        assert out["unchanged"], rank


def test_one_ranks_failed_check_raises_on_every_rank_before_any_write():
    results = run_distributed(a_failed_check_on_one_rank_stops_every_rank, 2)
    assert "'lm_head.weight'" in results[1]["error"] and "exp_avg has shape [3, 3]" in results[1]["error"]
    assert "rank 1 failed its checks" in results[0]["error"] and "'lm_head.weight'" in results[0]["error"]
    assert results[0]["unchanged"] and results[1]["unchanged"]


# ---------------------------------------------------------------- on the ranks
def _loss_step(model, optimizer, ids) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).mean().backward()
    optimizer.step()


def _decoder():
    """The same decoder on every rank, its optimizer and a batch."""
    torch.manual_seed(7)
    model = TinyDecoder()
    return model, dmuon.DMuon(model, lr=0.02), torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0))


def _step_outcome(model, step) -> dict:
    """step()'s error ("" when it passed) and whether every parameter of `model` is unchanged."""
    before = [p.detach().clone() for p in model.parameters()]
    try:
        step()
        error = ""
    except RuntimeError as e:
        error = str(e)
    return {"error": error, "unchanged": all(torch.equal(p, b) for p, b in zip(model.parameters(), before))}


def replicas_that_differ_are_refused(rank: int, world: int) -> dict:
    """Every rank builds its own model (a seed sweep): DMuon on the default group refuses it on
    every rank; with process_group="local" each rank trains its own model exactly."""
    torch.manual_seed(100 + rank)
    model = TinyDecoder()
    out = {}
    try:
        dmuon.DMuon(model, lr=0.02)
        out["error"] = ""
    except ValueError as error:
        out["error"] = str(error)
    optimizer = dmuon.DMuon(model, lr=0.02, process_group="local")
    exact = copy.deepcopy(model)
    reference = reference_of(optimizer, exact)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        _loss_step(model, optimizer, ids)
        exact.zero_grad(set_to_none=True)
        exact(ids).logsumexp(-1).mean().backward()
        reference.step()
    out["max_error"] = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), exact.parameters()))
    out["runtime_world"] = optimizer.runtime.world_size
    return out


def equal_replicas_pass(rank: int, world: int) -> int:
    return _decoder()[1].runtime.world_size


def add_param_group_on_some_ranks(rank: int, world: int) -> dict:
    """Rank 0 alone adds a group: the next step raises on every rank, naming the group, and
    changes nothing."""
    model, optimizer, ids = _decoder()
    _loss_step(model, optimizer, ids)
    if rank == 0:
        optimizer.add_param_group({"params": [("extra.weight", nn.Parameter(torch.randn(8, 8)))], "use_muon": True})
    return _step_outcome(model, lambda: _loss_step(model, optimizer, ids))


def a_failed_check_on_one_rank_stops_every_rank(rank: int, world: int) -> dict:
    """Rank 1's AdamW state is corrupt: every rank raises before writing, naming it."""
    model, optimizer, ids = _decoder()
    _loss_step(model, optimizer, ids)
    optimizer.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).mean().backward()
    if rank == 1:
        optimizer.state[model.lm_head.weight]["exp_avg"] = torch.zeros(3, 3)
    return _step_outcome(model, optimizer.step)


def adamw_gradient_on_some_ranks_only(rank: int, world: int) -> dict:
    """Rank 0 alone has a gradient for an AdamW parameter (the embedding): the step raises
    on every rank, naming it, and changes nothing (the engine agrees on the presence of
    the gradients it only checks, as on the Muon parameters')."""
    model, optimizer, ids = _decoder()
    optimizer.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).mean().backward()
    if rank == 1:
        model.embed_tokens.weight.grad = None
    return {**_step_outcome(model, optimizer.step),
            "adamw": not any(g["use_muon"] for g in optimizer.param_groups
                             if any(p is model.embed_tokens.weight for p in g["params"]))}
