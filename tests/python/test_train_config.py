"""`python -m dmuon train`'s settings: every bad value of TrainConfig gets an error naming
its field, and the command line reports it (exit code 2) before anything runs."""

from __future__ import annotations

import pytest

from dmuon.cli.main import main
from dmuon.cli.train.config import TrainConfig


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(optimizers=()), "optimizers must name at least one"),
    (dict(optimizers=("sgd",)), "unknown optimizer 'sgd'"),
    (dict(optimizers=("dmuon", "dmuon")), "must not repeat"),
    (dict(device="tpu"), "device must be"),
    (dict(world=-1), "world must be >= 0"),
    (dict(parallel="zero3"), "parallel must be"),
    (dict(steps=0), "steps must be >= 1"),
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(seq_len=0), "seq_len must be >= 1"),
    (dict(d_model=0), "d_model must be >= 1"),
    (dict(num_layers=0), "num_layers must be >= 1"),
    (dict(num_heads=0), "num_heads must be >= 1"),
    (dict(mlp_ratio=0), "mlp_ratio must be >= 1"),
    (dict(eval_every=0), "eval_every must be >= 1"),
    (dict(d_model=30, num_heads=4), r"d_model \(30\) must be divisible by num_heads \(4\)"),
    (dict(eval_max_batches=0), "eval_max_batches must be >= 1 or None"),
    (dict(val_fraction=0.0), "val_fraction must be in"),
    (dict(val_fraction=1.0), "val_fraction must be in"),
    (dict(lr=0.0), "lr must be > 0"),
    (dict(adamw_lr=-1e-3), "adamw_lr must be > 0"),
    (dict(lr=float("nan")), "lr must be > 0"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
    (dict(betas=(0.9, 1.0)), "betas must be two values"),
    (dict(betas=(0.9,)), "betas must be two values"),
    (dict(warmup_steps=-1), "warmup_steps must be >= 0"),
    (dict(min_lr_ratio=1.5), "min_lr_ratio must be in"),
    (dict(grad_clip=-1.0), "grad_clip must be >= 0"),
    (dict(checkpoint_every=-1), "checkpoint_every must be >= 0"),
    (dict(optimizers=("torch-muon",), resume=True), "'torch-muon'.*no state dict to checkpoint"),
], ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else None)
def test_every_bad_setting_names_its_field(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        TrainConfig(**kwargs)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(world=3, batch_size=16), "batch_size 16 must be divisible by world 3"),
    (dict(world=2, device="cuda:0"), "names one GPU"),
    (dict(world=2, optimizers=("dmuon", "torch-muon")), "'torch-muon'.*one process only"),
])
def test_settings_that_do_not_fit_the_world_are_refused_when_resolved(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        TrainConfig(**{"device": "cpu", **kwargs}).resolved()


@pytest.mark.parametrize("argv, pattern", [
    (["--steps", "0"], "steps must be >= 1"),
    (["--optimizers", "dmuon,sgd"], "unknown optimizer 'sgd'"),
    (["--world", "3", "--device", "cpu"], "batch_size 16 must be divisible by world 3"),
    (["--heads", "3"], r"d_model \(128\) must be divisible by num_heads \(3\)"),
])
def test_the_command_line_reports_a_bad_setting_before_running(tmp_path, capsys, argv, pattern):
    import re

    assert main(["train", *argv, "--out", str(tmp_path), "--no-plot", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert re.search(pattern, captured.err) and "python -m dmuon train: error:" in captured.err, captured.err
    assert "data:" not in captured.out and not list(tmp_path.iterdir())  # nothing ran, nothing written
