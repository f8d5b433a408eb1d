"""torch.optim conventions a switching user relies on: frozen parameters stay in the optimizer
and train once unfrozen; schedulers that cycle momentum (OneCycleLR, CyclicLR) work, and the
step uses the momentum and betas they set."""

from __future__ import annotations

import copy

import pytest
import torch

import dmuon
from contract_models import TinyDecoder
from dmuon.reference import ReferenceDMuon
from worker_tensors import reference_of


def sync(reference: ReferenceDMuon, optimizer) -> None:
    for ref_group, group in zip(reference.groups, optimizer.param_groups):
        ref_group.update({k: copy.deepcopy(v) for k, v in group.items() if k != "params"})


def step_both(model, model_copy, optimizer, reference, ids) -> None:
    for m in (model, model_copy):
        m.zero_grad(set_to_none=True)
        m(ids).logsumexp(-1).mean().backward()
    sync(reference, optimizer)
    optimizer.step()
    reference.step()


def assert_models_close(a, b) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q.to(p.dtype), rtol=2e-4, atol=2e-5, msg=name)


def test_frozen_parameters_stay_and_train_once_unfrozen():
    model = TinyDecoder()
    model.q_proj.requires_grad_(False)
    model.norm.requires_grad_(False)
    optimizer = dmuon.DMuon(model, lr=0.02)
    names = {optimizer.param_name(p) for g in optimizer.param_groups for p in g["params"]}
    assert {"q_proj.weight", "norm.weight", "norm.bias"} <= names
    exact = copy.deepcopy(model)
    reference = reference_of(optimizer, exact)
    ids = torch.randint(0, 32, (2, 6))
    frozen = model.q_proj.weight.detach().clone()
    step_both(model, exact, optimizer, reference, ids)
    assert torch.equal(model.q_proj.weight, frozen)  # no gradient: not updated
    model.q_proj.requires_grad_(True)
    model.norm.requires_grad_(True)
    exact.q_proj.requires_grad_(True)
    exact.norm.requires_grad_(True)
    for _ in range(2):
        step_both(model, exact, optimizer, reference, ids)
    assert not torch.equal(model.q_proj.weight, frozen)
    assert_models_close(model, exact)


@pytest.mark.parametrize("scheduler", ["one_cycle", "cyclic"])
def test_schedulers_that_cycle_momentum_drive_muon_momentum_and_adamw_beta1(scheduler):
    model = TinyDecoder()
    optimizer = dmuon.DMuon(model, lr=0.02, adamw_betas=(0.9, 0.99))
    if scheduler == "one_cycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=8)  # cycle_momentum=True
    else:
        sched = torch.optim.lr_scheduler.CyclicLR(optimizer, base_lr=0.01, max_lr=0.05, step_size_up=2,
                                                  base_momentum=0.8, max_momentum=0.9)
    exact = copy.deepcopy(model)
    reference = reference_of(optimizer, exact)
    ids = torch.randint(0, 32, (2, 6))
    seen = set()
    for _ in range(4):
        step_both(model, exact, optimizer, reference, ids)
        sched.step()
        muon, adamw = optimizer.param_groups[0], optimizer.param_groups[1]
        assert adamw["betas"] == (adamw["momentum"], 0.99)  # the scheduler's momentum is AdamW's beta1
        assert muon["momentum"] == adamw["momentum"]
        seen.add(round(muon["momentum"], 6))
    assert len(seen) >= 3  # it really cycled
    assert_models_close(model, exact)


def test_adamw_betas_and_momentum_are_one_value():
    optimizer = dmuon.DMuon(TinyDecoder(), adamw_betas=(0.9, 0.98))
    adamw = optimizer.param_groups[1]
    assert not adamw["use_muon"] and adamw["momentum"] == 0.9
    adamw["betas"] = (0.85, 0.97)
    assert adamw["momentum"] == 0.85
    adamw["momentum"] = 0.8
    assert adamw["betas"] == (0.8, 0.97)
    loaded = dmuon.DMuon(TinyDecoder(), adamw_betas=(0.9, 0.98))
    loaded.load_state_dict(optimizer.state_dict())
    loaded.param_groups[1]["momentum"] = 0.7
    assert loaded.param_groups[1]["betas"] == (0.7, 0.97)
    with pytest.raises(ValueError, match=r"\['momentum'\].*betas\[0\]"):
        dmuon.DMuon([{"params": [torch.nn.Parameter(torch.randn(3))], "use_muon": False, "momentum": 0.9}])
