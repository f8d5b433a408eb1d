"""lab/benches/fake_rank_host_profile.py: a narrowed model keeps its structure, the phases
tile the step, and (with transformers) a CPU run at fake world 4 prints every phase."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dmuon.cli.bench import e2e_models

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "benches" / "fake_rank_host_profile.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("fake_rank_host_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_narrowed_model_keeps_layers_and_heads_at_smaller_widths(monkeypatch):
    tool = load_tool()
    monkeypatch.setattr(e2e_models, "HF_CONFIGS", dict(e2e_models.HF_CONFIGS))
    name = tool.narrow_config("qwen2.5-7b", 64)
    kind, narrow = e2e_models.HF_CONFIGS[name]
    _, full = e2e_models.HF_CONFIGS["qwen2.5-7b"]
    assert kind == "qwen2" and name == "qwen2.5-7b-narrow64"
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"):
        assert narrow[key] == full[key], key
    assert narrow["hidden_size"] == 28 * 2  # head size 128 / 64, even for the rotary embedding
    assert narrow["intermediate_size"] == 18944 // 64 and narrow["vocab_size"] == 152064 // 64
    assert tool.narrow_config("qwen2.5-7b", 1) == "qwen2.5-7b"


def test_the_phases_tile_the_step():
    tool = load_tool()
    marks = {"inputs0": 1.0, "inputs1": 2.0, "engine0": 2.5, "engine1": 4.0, "adamw0": 4.25, "adamw1": 5.0,
             "agree0": 5.0, "agree1": 6.0}
    phases = tool.phase_seconds(marks, 0.5, 6.5)
    assert phases == {"inputs": 1.5, "prelude": 0.5, "engine": 1.5, "adamw": 0.75, "agree": 1.0, "after": 0.5}
    # One process: no AdamW part, no deferred agreement.
    alone = tool.phase_seconds({"inputs1": 1.0, "engine0": 1.5, "engine1": 3.0}, 0.0, 3.25)
    assert alone["adamw"] == alone["agree"] == 0.0 and alone["after"] == 0.25


@pytest.mark.slow
def test_a_cpu_run_prints_every_phase():
    pytest.importorskip("transformers")
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "qwen2.5-0.5b", "--narrow", "32", "--world", "4",
                          "--device", "cpu", "--steps", "2"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    values = dict(re.findall(r"(\w+) (\d+\.\d+)", line))
    assert set(values) == {"inputs", "prelude", "engine", "adamw", "agree", "after", "step"}, line
    assert float(values["engine"]) > 0 and float(values["agree"]) > 0, line
