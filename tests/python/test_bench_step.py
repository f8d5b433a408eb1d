"""`python -m dmuon bench step` on CPU processes over Gloo: one table per world size, the
scaling table, the JSON record (bytes that follow from the layout), and bad arguments."""

from __future__ import annotations

import json

import pytest

from dmuon.cli.main import main
from dmuon.cli.launch import resolve_world

# Small, awkward matrices: square, wide, tall, a 3-D stack, one row (empty shards at world 2).
_MANIFEST = {"name": "small", "matrices": [
    {"name": "layers.{i}.q", "rows": 48, "cols": 48, "count": 2},
    {"name": "layers.{i}.up", "rows": 72, "cols": 48, "count": 2},
    {"name": "layers.{i}.down", "rows": 48, "cols": 72},
    {"name": "experts", "rows": 16, "cols": 24, "batch": 3},
    {"name": "thin", "rows": 1, "cols": 40},
]}


def _rank0_numel(world: int) -> int:
    """Elements on rank 0 (torch.chunk's first, largest, block of dim 0) of every matrix."""
    total = 0
    for m in _MANIFEST["matrices"]:
        dim0, rest = (m["batch"], m["rows"] * m["cols"]) if m.get("batch", 1) > 1 else (m["rows"], m["cols"])
        total += m.get("count", 1) * -(-dim0 // world) * rest
    return total


@pytest.mark.slow
def test_worlds_print_one_table_each_a_scaling_table_and_json(tmp_path, capsys):
    manifest = tmp_path / "small.json"
    manifest.write_text(json.dumps(_MANIFEST))
    out = tmp_path / "step.json"
    assert main(["bench", "step", "--manifest", str(manifest), "--worlds", "1,2", "--device", "cpu",
                 "--steps", "1", "--warmup", "0", "--profile-steps", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "world 1 (Gloo" in printed and "world 2 (Gloo" in printed and "scaling: small" in printed
    # The default pipeline depth, twice the world size, is part of each world's header.
    assert "world 2 (Gloo, CPU processes) | pipeline depth 4 buckets" in printed, printed
    for method in ("owner", "gather", "adamw (fused)"):
        assert sum(line.startswith(method) for line in printed.splitlines()) == 2, method
    assert "planner's predicted NS makespan" in printed

    record = json.loads(out.read_text())
    assert set(record["worlds"]) == {"1", "2"} and record["wire_dtype"] == "float32"
    one, two = record["worlds"]["1"]["slowest_rank"], record["worlds"]["2"]["slowest_rank"]
    assert one["owner"]["bytes_sent"] == 0 and one["gather"]["bytes_sent"] == 0
    # Gather mode: every rank sends its rows of every matrix to the other rank (float32).
    assert two["gather"]["bytes_sent"] == _rank0_numel(2) * 4
    assert 0 < two["owner"]["bytes_sent"] <= two["gather"]["bytes_sent"]
    assert two["owner"]["predicted_ns_s"] > 0 and len(two["owner"]["split_s"]) == 5
    # The split comes from the extra synchronized steps (on a second process group).
    assert two["owner"]["split_source"] == "1 synchronized steps" and two["owner"]["profiled_step_s"] > 0
    assert all(entry["step_s"] > 0 for entry in two.values())
    assert set(record["worlds"]["2"]["per_rank"]) == {"0", "1"}


# NOTE: --world two and --steps 0 are test_cli_errors' (the same messages, as usage errors).
@pytest.mark.parametrize("argv, message", [
    (["--worlds", "2,x"], "--worlds: 'x' is not a positive integer"),
    (["--worlds", ","], "--worlds must list world sizes"),
    (["--world", "0"], "--world must be >= 1"),
    (["--profile-steps", "-1"], "--profile-steps must be >= 0"),
])
def test_bad_arguments_name_the_argument(argv, message):
    with pytest.raises(ValueError, match=message):
        main(["bench", "step", "--model", "qwen2.5-0.5b", "--device", "cpu", *argv])


def test_world_auto_is_two_cpu_processes_and_gpu_counts_are_checked():
    assert resolve_world("auto", "cpu") == 2
    assert resolve_world("3", "cpu") == 3
    with pytest.raises(ValueError, match="needs 1000 GPUs"):
        resolve_world(1000, "cuda")
