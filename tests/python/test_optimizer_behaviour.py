"""DMuon as a torch optimizer: state_dict round trip, schedulers, zero_grad, missing
gradients, zero-size and mixed-dtype parameters, non-finite gradients."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import dmuon
from worker_tensors import reference_of


def make_model(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Embedding(30, 16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16),
                         nn.LayerNorm(16)).to(dtype)


def train(model, opt, num_steps, seed=0, scheduler=None):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(num_steps):
        tokens = torch.randint(0, 30, (4, 6), generator=gen)
        opt.zero_grad()
        model(tokens).float().pow(2).mean().backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def test_state_dict_round_trip_restores_the_exact_trajectory():
    model = make_model()
    opt = dmuon.DMuon(model, lr=0.01)
    train(model, opt, 3)
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    train(model, opt, 3, seed=1)

    resumed = make_model()
    resumed.load_state_dict(saved_model)
    resumed_opt = dmuon.DMuon(resumed, lr=0.5)  # options come back from the state dict
    resumed_opt.load_state_dict(saved_opt)
    assert resumed_opt.param_groups[0]["lr"] == 0.01 and resumed_opt.param_groups[0]["num_steps"] == 3
    train(resumed, resumed_opt, 3, seed=1)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_state_holds_momentum_and_adamw_moments():
    model = make_model()
    opt = dmuon.DMuon(model)
    train(model, opt, 1)
    muon, adamw = opt.param_groups
    for p in muon["params"]:
        assert set(opt.state[p]) == {"momentum_buffer"}
    for p in adamw["params"]:
        assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"}


def test_lr_scheduler_sets_the_lr_each_step_uses():
    """StepLR halves both groups' lr after every step: each step must use its own lr, so the
    parameters match the reference run whose lrs are set by hand to 0.1, 0.05, 0.025 (Muon)
    and 0.01, 0.005, 0.0025 (AdamW), within the parity tolerance (test_reference_parity)."""
    model = make_model()
    ref_model = copy.deepcopy(model)
    opt = dmuon.DMuon(model, lr=0.1, adamw_lr=0.01)
    ref = reference_of(opt, ref_model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    gen = torch.Generator().manual_seed(0)
    for step in range(3):
        tokens = torch.randint(0, 30, (4, 6), generator=gen)
        for m in (model, ref_model):
            m.zero_grad()
            m(tokens).pow(2).mean().backward()
        for group, base in zip(ref.groups, (0.1, 0.01)):
            group["lr"] = base * 0.5**step
        opt.step()
        ref.step()
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.0125, 0.00125])
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, atol=2e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_lr_zero_and_no_decay_leaves_parameters_unchanged():
    model = make_model()
    before = copy.deepcopy(model)
    opt = dmuon.DMuon(model, lr=0.0)
    train(model, opt, 2)
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, q)


def test_parameters_without_gradients_are_left_alone():
    model = make_model()
    opt = dmuon.DMuon(model, lr=0.01)
    untouched = model[3].weight.detach().clone()
    tokens = torch.randint(0, 30, (4, 6))
    model(tokens)[..., :1].sum().backward()
    model[3].weight.grad = None
    opt.step()
    assert torch.equal(model[3].weight, untouched)
    assert model[3].weight not in opt.state
    assert not torch.equal(model[1].weight, make_model()[1].weight)


def test_zero_element_parameter_is_accepted_and_the_others_step_as_without_it():
    empty = nn.Parameter(torch.randn(0, 5))
    full = nn.Parameter(torch.randn(4, 5))
    initial = full.detach().clone()
    alone = nn.Parameter(initial.clone())
    opt = dmuon.DMuon([empty, full], lr=0.1)
    opt_alone = dmuon.DMuon([alone], lr=0.1)
    for _ in range(2):
        grad = torch.randn(4, 5)
        empty.grad = torch.randn(0, 5)
        full.grad, alone.grad = grad.clone(), grad.clone()
        opt.step()
        opt_alone.step()
    assert empty.shape == (0, 5) and opt.param_groups[0]["num_steps"] == 2
    assert not torch.equal(full, initial)  # it moved, exactly as without the empty parameter
    assert torch.equal(full, alone)
    assert torch.equal(opt.state[full]["momentum_buffer"], opt_alone.state[alone]["momentum_buffer"])


def test_mixed_dtypes_in_one_model():
    model = make_model()
    model[1].to(torch.bfloat16)  # one bf16 Linear among fp32 parameters
    opt = dmuon.DMuon(model, lr=0.01)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert model[1].weight.dtype == torch.bfloat16
    assert opt.state[model[1].weight]["momentum_buffer"].dtype == torch.bfloat16
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nonfinite_gradient_raises_naming_parameter_and_step_and_changes_nothing():
    model = make_model()
    opt = dmuon.DMuon(model, lr=0.01)
    train(model, opt, 1)
    before = copy.deepcopy(model)
    before_state = copy.deepcopy(opt.state_dict())
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    model[3].weight.grad[0, 0] = float("nan")
    with pytest.raises(dmuon.NonFiniteGradientError, match=r"'3\.weight' at step 2"):
        opt.step()
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, q)
    after_state = opt.state_dict()
    for k, v in before_state["state"].items():
        for name, t in v.items():
            assert torch.equal(t, after_state["state"][k][name])


def test_nonfinite_skip_counts_and_changes_nothing():
    model = make_model()
    opt = dmuon.DMuon(model, lr=0.01, nonfinite="skip")
    train(model, opt, 1)
    before = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    model[4].bias.grad[3] = math.inf  # an AdamW parameter
    opt.step()
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, q)
    assert opt.param_groups[0]["num_skipped_steps"] == 1 and opt.param_groups[0]["num_steps"] == 2
    train(model, opt, 1)
    assert opt.param_groups[0]["num_skipped_steps"] == 1 and opt.param_groups[0]["num_steps"] == 3


def test_non_finite_result_is_reported_naming_the_parameter_and_not_applied():
    # NOTE: coefficients that only scale (a = 1e9, b = c = 0) overflow fp32 within five steps:
    # every entry of the update is Inf although the gradient is finite. Without decay the
    # parameter keeps its value (no non-finite entry is applied).
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(16, 24))
    opt = dmuon.DMuon([p], lr=0.02, weight_decay=0.0, ns_coefficients=[(1e9, 0.0, 0.0)] * 5)
    p.grad = torch.randn_like(p)
    before = p.detach().clone()
    with pytest.raises(RuntimeError, match=r"dmuon step 1: the orthogonalized update of parameter 'params\[0\]' "
                                           r"is not finite; its non-finite entries were not applied"):
        opt.step()
    assert torch.equal(p.detach(), before)


def test_corrupt_momentum_buffer_is_reported_and_nothing_changes():
    model = make_model()
    opt = dmuon.DMuon(model, lr=0.01, nonfinite="skip")
    train(model, opt, 1)
    opt.state[model[3].weight]["momentum_buffer"][1, 2] = float("nan")
    before = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    with pytest.raises(dmuon.NonFiniteGradientError, match=r"momentum buffer of parameter '3\.weight'"):
        opt.step()
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, q)
