"""The deprecated spellings (docs/configuration.md, "Deprecated spellings"): DMuon's flat
keywords set their dataclass field as before, with one DeprecationWarning per keyword and
process naming the field; cost_cache is accepted and has no effect."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dmuon
from dmuon import config
from dmuon.config import FLAT_OPTIONS, Execution, MuonMath


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test as in a new process: no alias warned yet."""
    monkeypatch.setattr(config, "_WARNED", set())


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))


@pytest.mark.parametrize("name", sorted(FLAT_OPTIONS))
def test_each_flat_keyword_warns_once_naming_its_field(name):
    arg, field = FLAT_OPTIONS[name]
    cls = {"math": MuonMath, "execution": Execution}[arg]
    value = getattr(cls(), field)
    pattern = rf"flat keyword {name}= is deprecated; pass {arg}=dmuon\.{cls.__name__}\({field}=\.\.\.\)"
    with pytest.warns(DeprecationWarning, match=pattern) as record:
        opt = dmuon.DMuon(make_model(), **{name: value})
    assert [w.filename for w in record if w.category is DeprecationWarning] == [__file__]  # the caller's line
    assert getattr(getattr(opt, arg), field) == value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dmuon.DMuon(make_model(), **{name: value})  # NOTE: once per process


def test_cost_cache_is_accepted_and_has_no_effect():
    with pytest.warns(DeprecationWarning, match=r"cost_cache has no effect .*DMUON_AUTOTUNE_CACHE"):
        opt = dmuon.DMuon(make_model(), cost_cache="~/.cache/dmuon/ns_costs.txt")
    assert opt.execution == Execution()
    with pytest.warns(DeprecationWarning, match=r"cost_cache has no effect .*DMUON_AUTOTUNE_CACHE"):
        execution = Execution(cost_cache="costs.txt", planner="lpt")
    assert execution == Execution(planner="lpt") and "cost_cache" not in execution.as_dict()


def test_the_dataclasses_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dmuon.DMuon(make_model(), math=MuonMath(ns_steps=3), execution=Execution(planner="lpt"))
