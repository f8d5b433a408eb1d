"""Atomic, named failures: a checkpoint is checked whole before anything is loaded, a step
checks everything it will touch (AdamW half included) before it writes anything, float16
parameters train without NaN."""

from __future__ import annotations

import copy

import pytest
import torch

import dmuon
from contract_models import TinyDecoder
from worker_tensors import reference_of


def trained(model, steps=2, **options):
    optimizer = dmuon.DMuon(model, lr=0.02, **options)
    ids = torch.randint(0, 32, (2, 6))
    for _ in range(steps):
        optimizer.zero_grad()
        model(ids).logsumexp(-1).mean().backward()
        optimizer.step()
    return optimizer


def snapshot(optimizer, model):
    state = copy.deepcopy(optimizer.state_dict())
    return state, {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_unchanged(optimizer, model, before):
    state, params = before
    now = optimizer.state_dict()
    assert now["param_groups"] == state["param_groups"]
    assert now["state"].keys() == state["state"].keys()
    for key, entry in state["state"].items():
        for k, v in entry.items():
            assert torch.equal(now["state"][key][k], v), (key, k)
    for n, p in model.named_parameters():
        assert torch.equal(p, params[n]), n


# ---------------------------------------------------------------------------- load_state_dict
def test_another_models_checkpoint_is_refused_naming_the_first_mismatch():
    mine = TinyDecoder(dim=16)
    other = TinyDecoder(dim=12)  # same structure, other shapes
    optimizer = trained(mine)
    foreign = trained(other).state_dict()
    before = snapshot(optimizer, mine)
    with pytest.raises(ValueError, match=r"'q_proj\.weight'.*momentum_buffer has shape \[12, 12\] but the parameter "
                                         r"has shape \[16, 16\]"):
        optimizer.load_state_dict(foreign)
    assert_unchanged(optimizer, mine, before)


def test_checkpoint_group_structure_kind_and_options_are_checked_before_loading():
    model = TinyDecoder()
    optimizer = trained(model)
    good = optimizer.state_dict()
    before = snapshot(optimizer, model)

    swapped = copy.deepcopy(good)
    swapped["param_groups"][0]["use_muon"] = False
    with pytest.raises(ValueError, match=r"param group 0 is AdamW, this optimizer's is Muon"):
        optimizer.load_state_dict(swapped)
    fewer = copy.deepcopy(good)
    fewer["param_groups"] = fewer["param_groups"][:1]
    with pytest.raises(ValueError, match=r"1 param group\(s\) \['Muon'\], this optimizer 2"):
        optimizer.load_state_dict(fewer)
    bad_option = copy.deepcopy(good)
    bad_option["param_groups"][1]["betas"] = 0.9
    with pytest.raises(ValueError, match=r"param group 1 \(AdamW\): betas must be a pair"):
        optimizer.load_state_dict(bad_option)
    missing = copy.deepcopy(good)
    first_adamw = missing["param_groups"][1]["params"][0]
    del missing["state"][first_adamw]["exp_avg_sq"]
    with pytest.raises(ValueError, match=r"'embed_tokens\.weight'.*expected all of \['step', 'exp_avg', "
                                         r"'exp_avg_sq'\]"):
        optimizer.load_state_dict(missing)
    integer = copy.deepcopy(good)
    integer["state"][0]["momentum_buffer"] = integer["state"][0]["momentum_buffer"].long()
    with pytest.raises(ValueError, match=r"momentum_buffer has dtype torch.int64"):
        optimizer.load_state_dict(integer)
    assert_unchanged(optimizer, model, before)
    optimizer.load_state_dict(good)  # the good one still loads


@pytest.mark.parametrize("key, value, pattern", [
    ("exp_avg", float("inf"), r"exp_avg holds NaN or Inf"),
    ("exp_avg_sq", -1e-3, r"exp_avg_sq holds negative values"),
    ("momentum_buffer", float("nan"), r"momentum_buffer holds NaN or Inf"),
], ids=["inf-exp-avg", "negative-exp-avg-sq", "nan-momentum"])
def test_a_checkpoint_with_unsteppable_state_values_is_refused_by_name(key, value, pattern):
    # Catches: a load that checks only keys, shapes and dtypes (the next step would write
    # NaN into the weight).
    model = TinyDecoder()
    optimizer = trained(model)
    bad = copy.deepcopy(optimizer.state_dict())
    group = 0 if key == "momentum_buffer" else 1
    first = bad["param_groups"][group]["params"][0]
    bad["state"][first][key].view(-1)[3] = value
    before = snapshot(optimizer, model)
    with pytest.raises(ValueError, match=rf"state of parameter '[\w.]+' .*{pattern}.*nothing was loaded"):
        optimizer.load_state_dict(bad)
    assert_unchanged(optimizer, model, before)


def test_a_loaded_state_holds_the_checkpoints_values_for_every_parameter():
    # Loaded into an optimizer whose state holds other values (one step of other data, the
    # default math): every entry's values and every group option (the saved run's math
    # included) come back as saved, and the next step of both is bitwise the same. Catches:
    # a load that checks shapes and keeps (or reorders among same-shape parameters, as q/k/v
    # here) the values it had.
    model = TinyDecoder()
    optimizer = trained(model, steps=3, math=dmuon.MuonMath(ns_steps=4, ns_restarts=(1,)))
    saved = copy.deepcopy(optimizer.state_dict())
    other_model = TinyDecoder()
    other = trained(other_model, steps=1)
    other_model.load_state_dict(model.state_dict())
    other.load_state_dict(saved)
    now = other.state_dict()
    assert now["param_groups"] == saved["param_groups"]
    assert now["state"].keys() == saved["state"].keys()
    for key, entry in saved["state"].items():
        assert now["state"][key].keys() == entry.keys(), key
        for k, v in entry.items():
            assert torch.equal(now["state"][key][k], v), (key, k)
    grads = {n: torch.randn(p.shape) for n, p in model.named_parameters()}
    for m in (model, other_model):
        for n, p in m.named_parameters():
            p.grad = grads[n].clone()
    optimizer.step()
    other.step()
    for (n, p), q in zip(model.named_parameters(), other_model.parameters()):
        assert torch.equal(p, q), n


# ---------------------------------------------------------------------------- step
def test_a_step_that_would_fail_in_the_adamw_half_writes_nothing():
    model = TinyDecoder()
    optimizer = trained(model)
    ids = torch.randint(0, 32, (2, 6))
    optimizer.zero_grad()
    model(ids).logsumexp(-1).mean().backward()
    before = snapshot(optimizer, model)
    embed = model.embed_tokens.weight
    good = optimizer.state[embed]["exp_avg"]
    optimizer.state[embed]["exp_avg"] = torch.zeros(20, 16)  # corrupt state of an AdamW parameter
    with pytest.raises(RuntimeError, match=r"'embed_tokens\.weight'.*exp_avg has shape \[20, 16\].*\[32, 16\]"):
        optimizer.step()
    optimizer.state[embed]["exp_avg"] = good
    assert_unchanged(optimizer, model, before)  # the Muon half did not run either

    optimizer.param_groups[1]["betas"] = 0.9  # a bad option set after construction
    with pytest.raises(RuntimeError, match=r"param group 1 \(AdamW\): betas must be a pair"):
        optimizer.step()
    optimizer.param_groups[1]["betas"] = (0.9, 0.999)
    assert_unchanged(optimizer, model, before)
    optimizer.step()


def test_a_muon_buffer_of_the_wrong_shape_is_named_with_its_own_shape():
    model = TinyDecoder()
    optimizer = trained(model)
    model(torch.randint(0, 32, (2, 6))).logsumexp(-1).mean().backward()
    before = snapshot(optimizer, model)
    optimizer.state[model.up_proj.weight]["momentum_buffer"] = torch.zeros(16, 48)
    with pytest.raises(RuntimeError, match=r"'up_proj\.weight'.*momentum_buffer has shape \[16, 48\] but the "
                                           r"parameter has shape \[48, 16\]"):
        optimizer.step()
    state, params = before
    for n, p in model.named_parameters():
        assert torch.equal(p, params[n]), n


# ---------------------------------------------------------------------------- float16
def test_float16_parameters_train_without_nan_with_float32_adamw_moments():
    torch.manual_seed(3)
    model = TinyDecoder().half()
    exact = copy.deepcopy(model).float()
    optimizer = dmuon.DMuon(model, lr=0.01)
    reference = reference_of(optimizer, exact)
    for step in range(4):
        # NOTE: small gradients: their float16 squares (·(1 − β2)) underflow to 0.
        grads = {n: (torch.randn(p.shape) * 2e-3) for n, p in model.named_parameters()}
        for (n, p), q in zip(model.named_parameters(), exact.parameters()):
            p.grad = grads[n].half()
            q.grad = grads[n].half().float()
        optimizer.step()
        reference.step()
        for (n, p), q in zip(model.named_parameters(), exact.parameters()):
            assert torch.isfinite(p).all(), (step, n)
            # NOTE: each step rounds p to float16 (half an ulp, 2⁻¹¹ relative): ≤ 4 steps' worth.
            torch.testing.assert_close(p.float(), q, rtol=2.5e-3, atol=1e-4, msg=f"step {step}: {n}")
    embed_state = optimizer.state[model.embed_tokens.weight]
    assert embed_state["exp_avg_sq"].dtype == torch.float32 and embed_state["exp_avg_sq"].min() > 0
    # A checkpoint keeps them float32 (torch's load casts state to the parameter's dtype).
    loaded = dmuon.DMuon(copy.deepcopy(model), lr=0.01)
    loaded.load_state_dict(optimizer.state_dict())
    again = loaded.state[loaded.param_groups[1]["params"][0]]["exp_avg_sq"]
    assert again.dtype == torch.float32 and torch.equal(again, embed_state["exp_avg_sq"])
