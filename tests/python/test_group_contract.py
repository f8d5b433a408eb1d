"""torch.optim's group contract: param_names recorded and taken (as torch.optim does), fused
and foreach accepted without effect, adamw_lr as a group key and which lr the AdamW part
gets when a group carries lr."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dmuon


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8))


def names_of(optimizer) -> list[list[str]]:
    return [g.get("param_names") for g in optimizer.param_groups]


def test_param_names_are_recorded_when_built_from_names_as_torch_optim_does():
    m = model()
    by_module = dmuon.DMuon(m)
    by_pairs = dmuon.DMuon(m.named_parameters())
    expected = [["0.weight"], ["0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]]  # 2: the output head
    assert names_of(by_module) == names_of(by_pairs) == expected
    assert [g["param_names"] for g in by_module.state_dict()["param_groups"]] == expected
    torch_sgd = torch.optim.SGD(m.named_parameters(), lr=0.1)
    assert "param_names" in torch_sgd.state_dict()["param_groups"][0]
    # Bare tensors: no names, as torch.optim.
    bare = dmuon.DMuon([dict(params=[m[0].weight, m[2].weight], use_muon=True), dict(params=[m[1].weight], use_muon=False)])
    assert names_of(bare) == [None, None]
    assert "param_names" not in bare.state_dict()["param_groups"][0]


def test_param_names_as_group_input_route_as_named_pairs():
    m = model()
    named = list(m.named_parameters())
    groups = [{"params": [p for _, p in named], "param_names": [n for n, _ in named], "weight_decay": 0.05}]
    optimizer = dmuon.DMuon(groups)
    assert names_of(optimizer) == names_of(dmuon.DMuon(m))
    assert [optimizer.param_name(p) for p in optimizer.param_groups[0]["params"]] == ["0.weight"]
    with pytest.raises(ValueError, match=r"param group 0: param_names must be one name \(str\) per parameter"):
        dmuon.DMuon([{"params": [p for _, p in named], "param_names": ["a"]}])
    with pytest.raises(ValueError, match=r"parameter 0 is named '0.weight' in 'params' but 'x' in param_names"):
        dmuon.DMuon([{"params": named[:1], "param_names": ["x"], "use_muon": True}])


def test_groups_with_and_without_names_are_not_mixed():
    m = model()
    optimizer = dmuon.DMuon(m)
    with pytest.raises(ValueError, match=r"param group 2: parameter 'param_groups\[2\].params\[0\]' has no name"):
        optimizer.add_param_group({"params": [nn.Parameter(torch.randn(4, 4))], "use_muon": True})
    optimizer.add_param_group({"params": [("extra", nn.Parameter(torch.randn(4, 4)))], "use_muon": True})
    assert optimizer.param_groups[-1]["param_names"] == ["extra"]


def test_fused_and_foreach_are_accepted_kept_and_change_nothing():
    m, twin = model(), model()
    plain = dmuon.DMuon(m, lr=0.05)
    switched = dmuon.DMuon([{"params": list(twin.named_parameters()), "fused": True, "foreach": False}], lr=0.05)
    assert all(g["fused"] is True and g["foreach"] is False for g in switched.param_groups)
    x = torch.randn(4, 8)
    for _ in range(3):
        for mod, opt in ((m, plain), (twin, switched)):
            mod(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(m.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match=r"param group 0: fused must be None, True or False"):
        dmuon.DMuon([{"params": [model()[0].weight], "use_muon": True, "fused": "yes"}])


def test_adamw_lr_wins_over_a_groups_lr_for_the_adamw_part():
    m = model()
    named = list(m.named_parameters())
    # DMuon's adamw_lr over the group's lr (torchtitan puts an lr in every group).
    optimizer = dmuon.DMuon([{"params": named, "lr": 0.02}], lr=1.0, adamw_lr=3e-3, adamw_weight_decay=0.0)
    muon, adamw = optimizer.param_groups
    assert (muon["lr"], adamw["lr"], adamw["weight_decay"]) == (0.02, 3e-3, 0.0)
    # The group's adamw_lr over DMuon's.
    optimizer = dmuon.DMuon([{"params": named, "lr": 0.02, "adamw_lr": 1e-3, "adamw_weight_decay": 0.2}],
                            adamw_lr=3e-3)
    muon, adamw = optimizer.param_groups
    assert (muon["lr"], adamw["lr"], adamw["weight_decay"]) == (0.02, 1e-3, 0.2)
    assert "adamw_lr" not in muon and "adamw_lr" not in adamw
    # Without any adamw_*, the group's lr for both parts (as before).
    muon, adamw = dmuon.DMuon([{"params": named, "lr": 0.02}], adamw_lr=None).param_groups
    assert muon["lr"] == adamw["lr"] == 0.02


def test_adamw_lr_in_groups_of_one_kind():
    norm = model()[1]
    optimizer = dmuon.DMuon([{"params": [norm.weight], "use_muon": False, "adamw_lr": 4e-3}])
    assert optimizer.param_groups[0]["lr"] == 4e-3 and "adamw_lr" not in optimizer.param_groups[0]
    with pytest.raises(ValueError, match=r"param group 0 \(AdamW\) sets lr=0.1 and adamw_lr=0.004"):
        dmuon.DMuon([{"params": [norm.weight], "use_muon": False, "lr": 0.1, "adamw_lr": 4e-3}])
    with pytest.raises(ValueError, match=r"param group 0 \(Muon\) has unknown option\(s\) \['adamw_lr'\].*no AdamW part"):
        dmuon.DMuon([{"params": [model()[0].weight], "use_muon": True, "adamw_lr": 4e-3}])


def test_state_dict_with_param_names_round_trips():
    m = model()
    optimizer = dmuon.DMuon(m, lr=0.05)
    m(torch.randn(4, 8)).square().mean().backward()
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    fresh = dmuon.DMuon(copy.deepcopy(m), lr=0.05)
    fresh.load_state_dict(saved)
    assert names_of(fresh) == names_of(optimizer)
    assert fresh.state_dict()["param_groups"] == saved["param_groups"]
