"""Typed configuration (dmuon.config): each dataclass field's bad value is named, flat
keywords and dataclasses give the same update, presets, the schedule built once per group,
the code-path switches reaching the runtime (options over DMUON_* variables, variables read
per runtime), and state_dict round trips."""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import re

import pytest
import torch
from torch import nn

import dmuon
from dmuon import runtime_builder
from dmuon._ops import _C
from dmuon.config import FLAT_OPTIONS, Execution, MuonMath, Ownership, Preset
from dmuon.group_options import MATH_KEYS

REPO = pathlib.Path(__file__).resolve().parents[2]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 7), nn.LayerNorm(7))


def trained(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3, seed: int = 1) -> list[torch.Tensor]:
    """`steps` steps on random gradients drawn from `seed`; the parameters after them."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------ validation
BAD_FIELDS = [
    (MuonMath, "momentum", 1.0), (MuonMath, "momentum", -0.1), (MuonMath, "nesterov", 1),
    (MuonMath, "ns_algorithm", "cubic"), (MuonMath, "ns_steps", 0), (MuonMath, "ns_steps", 2.5),
    (MuonMath, "ns_coefficients", [(1.0, 2.0)]), (MuonMath, "ns_coefficients", [(1.0, 2.0, float("nan"))] * 5),
    (MuonMath, "ns_restarts", (3, 2)), (MuonMath, "ns_restarts", (9,)), (MuonMath, "eps", 0.0),
    (MuonMath, "adjust_lr", "rms"), (MuonMath, "normuon", 1), (MuonMath, "normuon_beta2", 1.0),
    (MuonMath, "normuon_beta2", -0.1), (MuonMath, "normuon_eps", 0.0),
    (Execution, "mode", "scatter"), (Execution, "bucket_size_mb", -1), (Execution, "bucket_size_mb", float("inf")),
    (Execution, "wire_dtype", "int8"), (Execution, "planner", "magic"), (Execution, "cost_model", "measured"),
    (Execution, "nonfinite", "ignore"), (Execution, "profile", "yes"), (Execution, "record_timeline", 1),
    (Execution, "fused_streams", 9),
    (Execution, "fused_streams", 0), (Execution, "pipeline_depth", -1), (Execution, "ns_batch_mb", 0),
    (Execution, "cuda_graphs", "1"), (Execution, "backward_step", "on"),
    (Ownership, "reshard_after_forward", None), (Ownership, "prefetch", -1), (Ownership, "bucket_size_mb", -2),
    (Ownership, "reduce_dtype", torch.int32), (Ownership, "param_dtype", torch.float64),
    (Ownership, "planner", "greedy"), (Ownership, "spread_layers", 1), (Ownership, "replicate_others", "no"),
]


@pytest.mark.parametrize("cls, field, value", BAD_FIELDS, ids=lambda v: repr(v)[:20])
def test_every_bad_field_is_named(cls, field, value):
    """The error names the field and the value, given to the dataclass or as DMuon's flat keyword."""
    makers = [lambda: cls(**{field: value})]
    if FLAT_OPTIONS.get(field) == ({MuonMath: "math", Execution: "execution"}.get(cls), field):
        makers.append(lambda: dmuon.DMuon(make_model(), **{field: value}))
    for make in makers:
        with pytest.raises(ValueError, match=re.escape(f"{cls.__name__}.{field} ")) as error:
            make()
        assert f"got {value!r}" in str(error.value), str(error.value)


def test_every_field_has_a_bad_value_tested():
    tested = {(cls, field) for cls, field, _ in BAD_FIELDS}
    for cls in (MuonMath, Execution, Ownership):
        for f in dataclasses.fields(cls):
            assert (cls, f.name) in tested, f"{cls.__name__}.{f.name} has no bad value in BAD_FIELDS"


def test_restarts_of_the_standard_iteration_are_refused():
    with pytest.raises(ValueError, match=r"MuonMath\.ns_restarts restarts only the 'gram' iteration"):
        MuonMath(ns_algorithm="standard", ns_restarts=(1,))


def test_dataclasses_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        MuonMath(0.9)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Execution().mode = "gather"  # type: ignore[misc]


def test_math_fields_are_the_group_keys():
    assert sorted(f.name for f in dataclasses.fields(MuonMath)) == sorted(MATH_KEYS)


# ------------------------------------------------------- flat ↔ dataclass mapping
FLAT = dict(momentum=0.9, nesterov=False, ns_algorithm="standard", ns_steps=4,
            ns_coefficients=[(3.4445, -4.7750, 2.0315)], eps=1e-6, adjust_lr="spectral",
            mode="gather", bucket_size_mb=0.001, wire_dtype="float32", planner="lpt", cost_model="analytic",
            nonfinite="skip")


def test_flat_keywords_and_dataclasses_give_the_same_update():
    math = MuonMath(**{k: v for k, v in FLAT.items() if FLAT_OPTIONS[k][0] == "math"})
    execution = Execution(**{k: v for k, v in FLAT.items() if FLAT_OPTIONS[k][0] == "execution"})
    flat_model, typed_model = make_model(), make_model()
    flat_opt = dmuon.DMuon(flat_model, lr=0.02, weight_decay=0.1, **FLAT)
    typed_opt = dmuon.DMuon(typed_model, lr=0.02, weight_decay=0.1, math=math, execution=execution)
    assert flat_opt.math == typed_opt.math and flat_opt.execution == typed_opt.execution
    assert flat_opt._runtime_options == typed_opt._runtime_options
    for a, b in zip(trained(flat_model, flat_opt), trained(typed_model, typed_opt)):
        assert torch.equal(a, b)
    # NOTE: and the options took effect: the default math gives another update.
    default_model = make_model()
    default = trained(default_model, dmuon.DMuon(default_model, lr=0.02, weight_decay=0.1))
    assert not torch.equal(default[0], trained(flat_model, flat_opt, steps=0)[0])


def test_every_flat_keyword_maps_onto_its_field():
    for name, (arg, field) in FLAT_OPTIONS.items():
        value = FLAT.get(name, {"ns_restarts": (1, 3), "normuon": True, "normuon_beta2": 0.9,
                                "normuon_eps": 1e-6}.get(name))
        opt = dmuon.DMuon(make_model(), **{name: value})
        expected = getattr(getattr(opt, arg).replace(**{field: value}), field)
        assert getattr(getattr(opt, arg), field) == expected, name


def test_conflicting_flat_and_dataclass_values_name_both():
    with pytest.raises(ValueError, match=r"momentum=0\.9 conflicts with math=MuonMath\(\.\.\., momentum=0\.95\)"):
        dmuon.DMuon(make_model(), momentum=0.9, math=MuonMath())
    with pytest.raises(ValueError, match=r"planner='lpt' conflicts with execution=Execution\(\.\.\., planner='milp'\)"):
        dmuon.DMuon(make_model(), planner="lpt", execution=Execution())
    # The same value in both places is no conflict (one triple equals ns_steps triples).
    opt = dmuon.DMuon(make_model(), ns_coefficients=[(3.0, -3.2, 1.2)],
                      math=MuonMath(ns_coefficients=[(3.0, -3.2, 1.2)] * 5))
    assert opt.math.ns_coefficients == ((3.0, -3.2, 1.2),) * 5


def test_unknown_keywords_and_wrong_types_are_refused():
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['momentun'\]"):
        dmuon.DMuon(make_model(), momentun=0.9)
    with pytest.raises(TypeError, match="math must be a dmuon.MuonMath or None, got Execution"):
        dmuon.DMuon(make_model(), math=Execution())
    with pytest.raises(ValueError, match=r"MuonMath\.ns_steps must be an integer"):
        dmuon.DMuon(make_model(), ns_steps=0)


def test_param_groups_override_math_fields():
    model = make_model()
    first, second = model[0], model[2]
    opt = dmuon.DMuon([{"params": [first.weight], "use_muon": True, "ns_steps": 3, "ns_restarts": [1]},
                       {"params": [second.weight], "use_muon": True}], math=MuonMath(ns_steps=6))
    schedules = [runtime_builder.group_schedule(opt, i, g) for i, g in enumerate(opt.param_groups)]
    assert [len(s.coefficients) for s in schedules] == [3, 6]
    assert [list(s.restart_after) for s in schedules] == [[1], [2]]
    with pytest.raises(ValueError, match=r"param group 0: ns_restarts must be strictly increasing"):
        dmuon.DMuon([{"params": [first.weight], "use_muon": True, "ns_restarts": [2, 2]}])


# ---------------------------------------------------------------- presets
def test_presets_are_typed_and_unpack_as_keywords():
    preset = dmuon.presets.keller_jordan()
    assert isinstance(preset, Preset) and isinstance(preset.math, MuonMath)
    assert preset.math.ns_algorithm == "standard" and preset.math.adjust_lr == "original"
    assert dict(preset)["math"] is preset.math
    model_a, model_b = make_model(), make_model()
    by_preset = dmuon.DMuon(model_a, **preset, execution=Execution(planner="lpt"))
    by_hand = dmuon.DMuon(model_b, lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, adjust_lr="original",
                          ns_algorithm="standard", ns_coefficients=[(3.4445, -4.7750, 2.0315)], ns_steps=5,
                          eps=1e-7, adamw_lr=3e-4, adamw_betas=(0.9, 0.95), adamw_eps=1e-10,
                          adamw_weight_decay=0.0, planner="lpt")
    for a, b in zip(trained(model_a, by_preset), trained(model_b, by_hand)):
        assert torch.equal(a, b)


# ----------------------------------------------------- the schedule, built once
def test_schedule_is_built_when_the_group_is_added_not_per_step(monkeypatch):
    builds = []
    real = runtime_builder._build_schedule
    monkeypatch.setattr(runtime_builder, "_build_schedule", lambda key: builds.append(key) or real(key))
    model = make_model()
    opt = dmuon.DMuon(model, lr=0.02)
    assert len(builds) == 1  # one Muon group
    trained(model, opt, steps=3)
    assert len(builds) == 1
    # A change of the group's ns options (by the user) is seen: built again, once.
    opt.param_groups[0]["ns_steps"] = 3
    trained(model, opt, steps=2)
    assert len(builds) == 2 and builds[-1][1] == 3
    options, _ = runtime_builder.group_rules(opt)
    assert len(options[0].schedule.coefficients) == 3


def test_cpp_schedule_has_the_algorithms_defaults():
    coefficients, restarts = _C.default_schedule("gram", 5)
    built = _C.ns_schedule("gram", 5)
    assert built.coefficients == [tuple(c) for c in coefficients] and list(built.restart_after) == list(restarts)
    assert list(_C.ns_schedule("standard", 5).restart_after) == []
    assert list(_C.ns_schedule("gram", 5, None, [1, 4]).restart_after) == [1, 4]
    with pytest.raises(RuntimeError, match="restarts are only defined for ns_algorithm='gram'"):
        _C.ns_schedule("standard", 5, None, [1])


# ----------------------------------------- code-path switches and DMUON_* variables
def runtime_of(**execution):
    return dmuon.DMuon(make_model(), lr=0.02, execution=Execution(**execution)).runtime


def test_execution_switches_reach_the_runtime(monkeypatch):
    for name in ("DMUON_PIPELINE_DEPTH", "DMUON_NS_BATCH_MB", "DMUON_FUSED_STREAMS", "DMUON_CUDA_GRAPHS",
                 "DMUON_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    switches = runtime_of(fused_streams=3, pipeline_depth=5, ns_batch_mb=7, cuda_graphs=False, profile=True).execution
    assert switches == dict(fused_streams=3, pipeline_depth=5, ns_batch_mb=7, cuda_graphs=False, profile=True)
    defaults = runtime_of().execution
    assert defaults["fused_streams"] == 2 and defaults["cuda_graphs"] and not defaults["profile"]
    assert defaults["ns_batch_mb"] == 2048


def test_record_timeline_fills_the_stage_timeline_of_the_last_step():
    for record in (False, True):
        model = make_model()
        opt = dmuon.DMuon(model, lr=0.02, execution=Execution(record_timeline=record))
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        assert opt.runtime.options.record_timeline is record
        # one tuple of phase seconds per stage, or none when not recorded
        times = list(opt.runtime.last_stats.bucket_times)
        assert (len(times) > 0 and all(len(t) == 4 and min(t) >= 0 for t in times)) if record else times == []


def test_last_stats_name_this_steps_matrices():
    # One process records its stats inside step(): they must name the matrices this step
    # orthogonalized (a stale active set named the previous step's).
    a, b = nn.Parameter(torch.randn(8, 4)), nn.Parameter(torch.randn(6, 4))
    opt = dmuon.DMuon([a, b], lr=0.02)
    a.grad, b.grad = torch.randn_like(a), torch.randn_like(b)
    opt.step()
    assert len(opt.runtime.last_stats.orthogonalized) == 2
    b.grad = None
    opt.step()
    assert len(opt.runtime.last_stats.orthogonalized) == 1


def test_variables_override_unset_fields_only(monkeypatch):
    monkeypatch.setenv("DMUON_PIPELINE_DEPTH", "4")
    monkeypatch.setenv("DMUON_CUDA_GRAPHS", "0")
    assert runtime_of().execution["pipeline_depth"] == 4
    assert runtime_of().execution["cuda_graphs"] is False
    assert runtime_of(pipeline_depth=1, cuda_graphs=True).execution == {
        **runtime_of().execution, "pipeline_depth": 1, "cuda_graphs": True}


def test_a_variable_changed_between_two_runtimes_is_seen_by_the_second(monkeypatch):
    # NOTE: the bug: common/env.cpp kept each variable's first value for the process.
    monkeypatch.setenv("DMUON_NS_BATCH_MB", "64")
    assert runtime_of().execution["ns_batch_mb"] == 64
    monkeypatch.setenv("DMUON_NS_BATCH_MB", "32")
    assert runtime_of().execution["ns_batch_mb"] == 32


def test_a_bad_variable_names_itself_and_a_bad_option_names_the_field(monkeypatch):
    monkeypatch.setenv("DMUON_NS_BATCH_MB", "0")
    with pytest.raises(RuntimeError, match="DMUON_NS_BATCH_MB must be at least 1, got 0"):
        runtime_of()
    monkeypatch.setenv("DMUON_CUDA_GRAPHS", "maybe")
    with pytest.raises(RuntimeError, match="DMUON_CUDA_GRAPHS='maybe' is not a boolean"):
        runtime_of(ns_batch_mb=1)


def _variables_in_sources() -> set[str]:
    """DMUON_* names read from the environment anywhere in csrc/ or python/."""
    names = set()
    for path in list((REPO / "csrc").rglob("*")) + list((REPO / "python").rglob("*.py")):
        if path.suffix in (".cpp", ".h", ".cu", ".cuh", ".py") and path.is_file():
            names |= set(re.findall(r'"(DMUON_[A-Z_]+)"', path.read_text(errors="replace")))
    return names


def test_every_variable_is_listed_once_and_documented():
    knobs = _C.env_knobs()
    names = [k["name"] for k in knobs]
    assert len(names) == len(set(names)) == 14
    assert _variables_in_sources() == set(names)
    assert sorted(k["name"] for k in knobs if k["kind"] == "override") == sorted(
        ["DMUON_FUSED_STREAMS", "DMUON_PIPELINE_DEPTH", "DMUON_NS_BATCH_MB", "DMUON_CUDA_GRAPHS"])
    doc = (REPO / "docs" / "configuration.md").read_text()
    for k in knobs:
        assert f"`{k['name']}`" in doc, f"{k['name']} is not in docs/configuration.md"
    for cls in (MuonMath, Execution, Ownership):
        for f in dataclasses.fields(cls):
            assert f"`{f.name}`" in doc, f"{cls.__name__}.{f.name} is not in docs/configuration.md"


# ----------------------------------------------------------- checkpoints
# NOTE: a state_dict's round trip (every group option, the math included, and every state
# value) is test_atomic_failures' test_a_loaded_state_holds_the_checkpoints_values_for_every_parameter.
def test_a_checkpoint_saved_before_ns_restarts_loads_with_the_default():
    model = make_model()
    opt = dmuon.DMuon(model, lr=0.02)
    trained(model, opt, steps=1)
    saved = copy.deepcopy(opt.state_dict())
    for group in saved["param_groups"]:
        group.pop("ns_restarts", None)
    fresh_model = make_model()
    fresh = dmuon.DMuon(fresh_model, lr=0.02)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["ns_restarts"] is None
    assert list(runtime_builder.group_schedule(fresh, 0, fresh.param_groups[0]).restart_after) == [2]
    trained(fresh_model, fresh, steps=1)


# ----------------------------------------------------------- weight ownership
def test_own_matrices_takes_ownership_options_or_flat_keywords():
    with pytest.raises(ValueError, match=r"Ownership\.prefetch must be an integer >= 0, got -1"):
        dmuon.own_matrices(make_model(), prefetch=-1)
    with pytest.raises(ValueError, match=r"prefetch=2 conflicts with options=Ownership\(\.\.\., prefetch=1\)"):
        dmuon.own_matrices(make_model(), options=Ownership(), prefetch=2)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['prefech'\]"):
        dmuon.own_matrices(make_model(), prefech=2)
    model = make_model()
    owned = dmuon.own_matrices(model, options=Ownership(prefetch=0, planner="lpt"))
    assert owned.params and all(dmuon.ownership.ownership_of(p) is owned for p in owned.params)
    assert owned._prefetch == 0  # the options took effect
