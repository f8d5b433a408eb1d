"""examples/hf_trainer.py: DMuon under the Hugging Face Trainer trains, checkpoints and resumes
to the same model as an uninterrupted run (needs transformers and accelerate; skipped without)."""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"


def load_example():
    spec = importlib.util.spec_from_file_location("hf_trainer_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hf_trainer_example_trains_and_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    example = load_example()
    common = ["--max-steps", "8", "--save-steps", "4", "--dim", "32", "--seq", "32", "--batch", "4"]
    output, whole = example.main(["--output-dir", str(tmp_path / "whole"), *common])
    assert output.global_step == 8 and output.training_loss < math.log(256)
    routing = {r.name: r for r in __import__("dmuon").route_module(whole)}
    assert routing["transformer.h.0.attn.c_attn.weight"].transposed
    assert not routing["transformer.wte.weight"].use_muon

    # The run interrupted after its step-4 checkpoint, then resumed.
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "whole" / "checkpoint-4", resumed_dir / "checkpoint-4")
    output, resumed = example.main(["--output-dir", str(resumed_dir), *common, "--resume"])
    assert output.global_step == 8
    for (name, p), q in zip(whole.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
