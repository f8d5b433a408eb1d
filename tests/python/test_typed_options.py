"""The engine's options are typed C++ objects (dmuon._C.engine: GroupRule, RuntimeOptions
with the engine's EngineOptions in it): each choice is an enum, made from its Python
spelling once, at the binding, with an error that names the option."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dmuon
from dmuon._ops import _C

E = _C.engine


def test_spellings_become_enums_at_the_boundary():
    options = E.RuntimeOptions(mode="gather", wire_dtype=E.WireDType.bfloat16, solver="lpt", device_type="cpu",
                               cost_model="profile", plan_source="local", bucket_bytes=4096)
    engine = options.engine
    assert (engine.mode, engine.wire_dtype, engine.solver) == (E.Mode.gather, E.WireDType.bfloat16, E.Solver.lpt)
    assert engine.plan_locally and engine.stage_bytes == 4096
    assert (options.device, options.device_type, options.cost_model) == (E.DeviceKind.cpu, "cpu", E.CostModel.profile)
    rule = E.GroupRule(lr=0.1, weight_decay=0.0, momentum=0.9, nesterov=True, adjust_lr="spectral",
                       schedule=_C.ns_schedule("gram", 5))
    assert rule.adjust_lr == E.AdjustLr.spectral and rule.adjust_lr == E.AdjustLr("spectral")


@pytest.mark.parametrize("enum, spelling, pattern", [
    (E.Mode, "scatter", "mode must be 'owner' or 'gather', got 'scatter'"),
    (E.WireDType, "int8", "wire_dtype must be"),
    (E.Solver, "magic", "solver must be"),
    (E.DeviceKind, "tpu", "device_type must be 'cpu' or 'cuda', got 'tpu'"),
    (E.AdjustLr, "sqrt", "adjust_lr"),
    (E.NsAlgorithm, "cubic", "ns_algorithm"),
    (E.CostModel, "measured", "cost_model must be 'auto', 'analytic' or 'profile', got 'measured'"),
])
def test_a_bad_spelling_names_the_option(enum, spelling, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        enum(spelling)


def test_the_runtime_holds_the_executions_options_typed():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    opt = dmuon.DMuon(model, execution=dmuon.Execution(mode="gather", planner="round_robin", wire_dtype="float32"))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    engine = opt.runtime.options.engine
    assert (engine.mode, engine.solver, engine.wire_dtype) == (E.Mode.gather, E.Solver.round_robin,
                                                               E.WireDType.float32)
