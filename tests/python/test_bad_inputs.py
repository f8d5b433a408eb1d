"""Bad inputs get errors that name the parameter, option or argument."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dmuon
from dmuon._ops import testing_ops


def matrix():
    return nn.Parameter(torch.randn(4, 6))


def test_vector_forced_into_muon_names_it():
    with pytest.raises(ValueError, match=r"'bias'.*needs a matrix"):
        dmuon.DMuon([{"params": [("bias", nn.Parameter(torch.randn(6)))], "use_muon": True}])


def test_unsupported_dtypes_name_the_parameter():
    with pytest.raises(TypeError, match=r"'counts'.*int64"):
        dmuon.DMuon([("counts", torch.zeros(3, 3, dtype=torch.int64))])
    with pytest.raises(TypeError, match=r"complex"):
        dmuon.DMuon([("z", nn.Parameter(torch.randn(3, 3, dtype=torch.complex64)))])


# NOTE: a dataclass field's bad value (MuonMath, Execution), given as a flat keyword or in the
# dataclass, is test_config's BAD_FIELDS; these are the group options and checks across fields.
@pytest.mark.parametrize("kwargs, pattern", [
    (dict(ns_steps=3, ns_coefficients=[(1, 2, 3), (1, 2, 3)]), "ns_coefficients"),
    (dict(lr=-1.0), "lr"),
    (dict(adamw_betas=(0.9, 1.5)), "betas"),
    (dict(adamw_betas=0.9), r"adamw_betas must be a pair \(beta1, beta2\).*got 0\.9"),
    (dict(adamw_betas=(0.9, 0.99, 0.9)), r"adamw_betas must be a pair"),
    (dict(adamw_betas=("a", 0.9)), r"adamw_betas must be a pair"),
    (dict(adamw_eps=-1.0), r"adamw_eps must be a finite number >= 0"),
    (dict(adamw_eps="1e-8"), r"adamw_eps must be a finite number >= 0"),
    (dict(adamw_lr=float("nan")), r"adamw_lr must be"),
    (dict(adamw_weight_decay=-0.1), r"adamw_weight_decay must be"),
    (dict(momentum="0.9"), r"momentum must be a number in \[0, 1\)"),
    (dict(nesterov="yes"), r"nesterov must be True or False"),
    (dict(weight_decay=None), r"weight_decay must be a finite number"),
    (dict(process_group="each"), r"process_group must be None.*'local'"),
])
def test_bad_options_name_the_option(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        dmuon.DMuon([matrix(), nn.Parameter(torch.randn(3))], **kwargs)


def test_unknown_group_option():
    # NOTE: an unknown keyword of DMuon is test_config's test_unknown_keywords_and_wrong_types_are_refused,
    # momentum in an AdamW group test_torch_conventions' test_adamw_betas_and_momentum_are_one_value.
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['momentun'\]"):
        dmuon.DMuon([{"params": [matrix()], "momentun": 0.9}])


def test_empty_and_mixed_inputs():
    with pytest.raises(ValueError, match="empty"):
        dmuon.DMuon([])
    with pytest.raises(TypeError, match="mixes"):
        dmuon.DMuon([{"params": [matrix()]}, matrix()])
    with pytest.raises(ValueError, match="mixes matrices and vectors"):
        dmuon.DMuon([{"params": [matrix(), nn.Parameter(torch.randn(3))]}])


def test_muon_parameters_on_two_devices_name_both():
    # NOTE: "meta" stands in for a second device on CPU-only machines.
    a, b = matrix(), nn.Parameter(torch.randn(4, 6, device="meta"))
    opt = dmuon.DMuon([a, b], lr=0.02)
    a.grad, b.grad = torch.randn(4, 6), torch.randn(4, 6, device="meta")
    with pytest.raises(ValueError, match=r"one device: 'params\[0\]' is on cpu, 'params\[1\]' on meta"):
        opt.step()


def test_sparse_gradient_names_the_parameter():
    p = matrix()
    opt = dmuon.DMuon([("table", p)])
    p.grad = torch.randn(4, 6).to_sparse()
    with pytest.raises(RuntimeError, match="'table'.*sparse"):
        opt.step()


def test_orthogonalize_op_checks_its_arguments():
    x = torch.randn(2, 4, 6)
    with pytest.raises(RuntimeError, match="3 numbers"):
        testing_ops.orthogonalize(x, "gram", [1.0, 2.0], [], 1e-7)
    with pytest.raises(RuntimeError, match="ns_algorithm"):
        testing_ops.orthogonalize(x, "newton", [1.0, 2.0, 3.0], [], 1e-7)
    with pytest.raises(RuntimeError, match="restart"):
        testing_ops.orthogonalize(x, "gram", [1.0, 2.0, 3.0], [4], 1e-7)
    with pytest.raises(RuntimeError, match="compute_dtype"):
        testing_ops.orthogonalize(x, "gram", [1.0, 2.0, 3.0], [], 1e-7, "aten", "int8")
    with pytest.raises(RuntimeError, match="matrices"):
        testing_ops.orthogonalize(torch.randn(5), "gram", [1.0, 2.0, 3.0], [], 1e-7)


@pytest.mark.slow
def test_a_negative_pipeline_depth_names_the_knob():
    import subprocess
    import sys

    script = ("import torch, dmuon\n"
              "p = torch.nn.Parameter(torch.randn(8, 6))\n"
              "opt = dmuon.DMuon([('w', p)], lr=0.02)\n"
              "p.grad = torch.randn(8, 6)\n"
              "opt.step()\n")
    import os

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DMUON_PIPELINE_DEPTH": "-1"})
    assert out.returncode != 0 and "DMUON_PIPELINE_DEPTH must be >= 0" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("streams", [-1, 9])
def test_a_bad_fused_stream_count_names_the_option(streams):
    p = nn.Parameter(torch.randn(8, 6))
    opt = dmuon.DMuon([("w", p)], lr=0.02)
    opt._runtime_options["fused_streams"] = streams
    p.grad = torch.randn(8, 6)
    with pytest.raises(RuntimeError, match=r"fused_streams must be between 1 and 8 .*got " + str(streams)):
        opt.step()
    assert "momentum_buffer" not in opt.state.get(p, {})


# NOTE: the choices named, and values BAD_FIELDS (test_config) has not, which checks the others.
@pytest.mark.parametrize("kwargs, pattern", [
    (dict(mode="scatter"), r"mode must be one of \('owner', 'gather'\), got 'scatter'"),
    (dict(wire_dtype="bf16"), r"wire_dtype must be one of .*got 'bf16'"),
    (dict(planner="magic"), r"planner must be one of \('milp', 'lpt', 'round_robin'\), got 'magic'"),
    (dict(bucket_size_mb=float("nan")), "bucket_size_mb must be a finite number >= 0"),
    (dict(bucket_size_mb="64"), r"bucket_size_mb must be a finite number >= 0 .*got '64'"),
], ids=lambda v: "-".join(f"{k}={v[k]!r}" for k in v) if isinstance(v, dict) else None)
def test_bad_execution_options_name_the_option(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        dmuon.DMuon([matrix()], **kwargs)


def test_the_step_runtime_checks_its_options_itself():
    """The C++ runtime, built directly (not through DMuon's checks), refuses bad options
    with a message naming them. NOTE: a bad spelling of a choice (mode, wire_dtype, solver,
    device_type, cost_model) is refused where it becomes an enum: test_typed_options."""
    from dmuon._ops import _C

    with pytest.raises(RuntimeError, match="fused_streams must be between 1 and 8"):
        options = _C.engine.RuntimeOptions(fused_streams=9)
        _C.engine.EngineRuntime("", ["w"], [_C.dist.ParamLayout([4, 6], 0, False)], ["float32"], [0], options)


def test_an_extension_built_against_another_torch_release_is_refused_naming_both(monkeypatch):
    import importlib
    import re

    import dmuon._ops as ops_module
    assert ops_module._C.torch_version == ".".join(torch.__version__.split(".")[:2])
    monkeypatch.setattr(ops_module._C, "torch_version", "2.0")
    try:
        with pytest.raises(ImportError, match=rf"built against torch 2\.0, but torch {re.escape(torch.__version__)}"):
            importlib.reload(ops_module)
    finally:
        monkeypatch.undo()
        importlib.reload(ops_module)
