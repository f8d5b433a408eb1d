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


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(ns_algorithm="polar"), "ns_algorithm"),
    (dict(adjust_lr="cosine"), "adjust_lr"),
    (dict(ns_steps=0), "ns_steps"),
    (dict(ns_steps=2.5), "ns_steps"),
    (dict(ns_coefficients=[(1.0, 2.0)]), "ns_coefficients"),
    (dict(ns_steps=3, ns_coefficients=[(1, 2, 3), (1, 2, 3)]), "ns_coefficients"),
    (dict(ns_coefficients=[(1.0, float("nan"), 2.0)]), "ns_coefficients"),
    (dict(lr=-1.0), "lr"),
    (dict(momentum=1.0), "momentum"),
    (dict(eps=0.0), "eps"),
    (dict(adamw_betas=(0.9, 1.5)), "betas"),
    (dict(nonfinite="ignore"), "nonfinite"),
])
def test_bad_options_name_the_option(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        dmuon.DMuon([matrix(), nn.Parameter(torch.randn(3))], **kwargs)


def test_unknown_group_option_and_unknown_keyword():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['momentun'\]"):
        dmuon.DMuon([{"params": [matrix()], "momentun": 0.9}])
    with pytest.raises(ValueError, match=r"\['momentum'\]"):
        dmuon.DMuon([{"params": [nn.Parameter(torch.randn(3))], "use_muon": False, "momentum": 0.9}])
    with pytest.raises(TypeError, match="momentun"):
        dmuon.DMuon([matrix()], momentun=0.9)


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


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(mode="scatter"), r"mode must be one of \('owner', 'gather'\), got 'scatter'"),
    (dict(wire_dtype="int8"), r"wire_dtype must be one of .*got 'int8'"),
    (dict(wire_dtype="bf16"), r"wire_dtype must be one of .*got 'bf16'"),
    (dict(planner="magic"), r"planner must be one of \('milp', 'lpt', 'round_robin'\), got 'magic'"),
    (dict(cost_model="measured"), r"cost_model must be one of .*got 'measured'"),
    (dict(bucket_size_mb=-1), r"bucket_size_mb must be a finite number >= 0 .*got -1"),
    (dict(bucket_size_mb=float("nan")), "bucket_size_mb must be a finite number >= 0"),
    (dict(bucket_size_mb=float("inf")), "bucket_size_mb must be a finite number >= 0"),
    (dict(bucket_size_mb="64"), r"bucket_size_mb must be a finite number >= 0 .*got '64'"),
], ids=lambda v: "-".join(f"{k}={v[k]!r}" for k in v) if isinstance(v, dict) else None)
def test_bad_execution_options_name_the_option(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        dmuon.DMuon([matrix()], **kwargs)


@pytest.mark.parametrize("field, value, pattern", [
    ("mode", "scatter", "mode must be 'owner' or 'gather', got 'scatter'"),
    ("wire_dtype", "int8", "wire_dtype must be auto, float32, bfloat16 or float16, got 'int8'"),
    ("solver", "magic", "solver must be 'round_robin', 'lpt' or 'milp', got 'magic'"),
    ("device_type", "tpu", "device_type must be 'cpu' or 'cuda', got 'tpu'"),
    ("fused_streams", 9, "fused_streams must be between 1 and 8"),
    ("cost_model", "measured", "cost_model must be 'auto', 'analytic' or 'profile', got 'measured'"),
])
def test_the_step_runtime_checks_its_options_itself(field, value, pattern):
    """The C++ runtime, built directly (not through DMuon's checks), refuses bad options
    with a message naming them."""
    from dmuon._ops import _C

    with pytest.raises(RuntimeError, match=pattern):
        options = _C.engine.RuntimeOptions(**{field: value})
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
