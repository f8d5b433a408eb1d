"""`python -m dmuon plan` on the shipped manifests, JSON manifests and config.json files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from dmuon.cli.main import main
from dmuon.cli.plan.manifest import manifest_from_config, shipped_models
from dmuon.cli.plan.planner import make_problem, solve

_SHIPPED = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b"]
# A Hugging Face config.json with 128 experts (Qwen3-30B-A3B's values), planned separately.
_MOE = "qwen3-30b-a3b"


def _plan_json(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json", "--time-limit", "0.3"]) == 0
    return json.loads(capsys.readouterr().out)


def test_shipped_manifests_are_listed():
    assert sorted(_SHIPPED + [_MOE]) == shipped_models()


@pytest.mark.parametrize("model", _SHIPPED)
def test_cli_on_shipped_manifests(capsys, model):
    report = _plan_json(capsys, "--model", model, "--world", "8")
    plans = report["plans"]
    assert set(plans) == {"round_robin", "lpt", "milp"}
    for plan in plans.values():
        assert len(plan["load_s"]) == 8
        assert plan["makespan_s"] == pytest.approx(max(plan["load_s"]))
        assert plan["makespan_s"] >= plan["lower_bound_s"] * (1 - 1e-12)
        assert plan["imbalance"] >= 1.0
    # MILP never loses to LPT; all solvers see the same lower bound.
    assert plans["milp"]["makespan_s"] <= plans["lpt"]["makespan_s"] * (1 + 1e-12)
    assert len({p["lower_bound_s"] for p in plans.values()}) == 1


def test_shipped_manifest_shapes_match_design(capsys):
    # Llama-3.1-8B: 32 layers × (q, k, v, o, gate, up, down); h = 4096, kv·d = 1024.
    report = _plan_json(capsys, "--model", "llama-3.1-8b", "--world", "4", "--per-rank", "--solvers", "lpt")
    assert report["num_matrices"] == 32 * 7
    shapes = {b["shape"] for r in report["plans"]["lpt"]["ranks"] for b in r["batches"]}
    assert shapes == {"4096x4096", "1024x4096", "14336x4096", "4096x14336"}
    owned = [m for r in report["plans"]["lpt"]["ranks"] for b in r["batches"] for m in b["matrices"]]
    assert sorted(owned) == sorted(set(owned)) and len(owned) == 224


def test_text_table_and_plot(tmp_path, capsys):
    png = tmp_path / "loads.png"
    assert main(["plan", "--model", "qwen2.5-0.5b", "--world", "8", "--plot", str(png), "--time-limit", "0.2"]) == 0
    out = capsys.readouterr().out
    for solver in ("round_robin", "lpt", "milp"):
        assert solver in out
    assert "makespan_ms" in out and "gap%" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_on_dense_config_json(tmp_path, capsys):
    config = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    from_config = _plan_json(capsys, "--manifest", str(path), "--world", "8")
    shipped = _plan_json(capsys, "--model", "qwen2.5-0.5b", "--world", "8")
    # Same matrices as the shipped manifest → same loads.
    assert from_config["num_matrices"] == shipped["num_matrices"] == 168
    assert from_config["plans"]["lpt"]["makespan_s"] == pytest.approx(shipped["plans"]["lpt"]["makespan_s"])


def test_cli_on_moe_config_json(tmp_path, capsys):
    # Qwen2-MoE style: every other layer sparse, 8 experts, a shared expert.
    config = {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 512,
        "num_experts": 8,
        "decoder_sparse_step": 2,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    manifest = manifest_from_config(config)
    stacks = [m for m in manifest.matrices if m.batch > 1]
    assert len(stacks) == 2 * 3 and all(m.batch == 8 for m in stacks)
    assert len(manifest.matrices) == 4 * 4 + 2 * 3 + 2 * (1 + 3 + 3)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    report = _plan_json(capsys, "--manifest", str(path), "--world", "4", "--per-rank", "--experts", "stack")
    batches = [b for r in report["plans"]["milp"]["ranks"] for b in r["batches"]]
    # With --experts stack a stack is owned whole: its batch counts all 8 experts.
    assert any(b["shape"] == "128x256" and b["num_matrices"] % 8 == 0 for b in batches)
    # Mixtral style keys.
    mixtral = manifest_from_config({"hidden_size": 64, "intermediate_size": 96, "num_local_experts": 4,
                                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1})
    assert {(m.rows, m.cols, m.batch) for m in mixtral.matrices if m.batch > 1} == {(96, 64, 4), (64, 96, 4)}


def test_json_manifest_with_counts_and_more_ranks_than_matrices(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"name": "tiny", "matrices": [
        {"name": "block{i}.w", "rows": 64, "cols": 256, "count": 2},
        {"name": "experts", "rows": 32, "cols": 64, "batch": 4},
    ]}))
    report = _plan_json(capsys, "--manifest", str(path), "--world", "16", "--per-rank", "--experts", "stack")
    assert report["model"] == "tiny" and report["num_matrices"] == 3
    for plan in report["plans"].values():
        owners = [r for r in plan["ranks"] if r["batches"]]
        assert len(owners) <= 3  # most ranks own nothing: valid
        names = sorted(m for r in owners for b in r["batches"] for m in b["matrices"])
        assert names == ["block0.w", "block1.w", "experts"]


@pytest.mark.parametrize(
    ("content", "world", "message"),
    [
        ('{"name": "e", "matrices": []}', "4", "empty manifest"),
        ('{"matrices": [{"rows": 4, "cols": 0}]}', "4", "'cols' must be a positive integer"),
        ('{"matrices": [{"rows": 4, "cols": 4}]}', "0", "--world must be at least 1"),
        ('{"matrices": [\n  {"rows": 4,, "cols": 4}]}', "4", ":2:14: malformed JSON"),
    ],
)
def test_bad_input_errors(tmp_path, capsys, content, world, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["plan", "--manifest", str(path), "--world", world]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "malformed" in message:
        assert str(path) in err


def test_memory_cap_error_names_matrix_and_cap(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--world", "8", "--memory-cap-gib", "0.3"]) == 2
    err = capsys.readouterr().err
    assert "gate_proj" in err and f"memory_cap_bytes = {int(0.3 * 2**30)}" in err


def test_unknown_model_lists_the_shipped_ones(capsys):
    assert main(["plan", "--model", "gpt-9", "--world", "8"]) == 2
    assert "llama-3.1-8b" in capsys.readouterr().err


def test_python_api_plan_roundtrip():
    matrices = [(f"w{i}", 128, 512, 1) for i in range(10)] + [("stack", 64, 64, 8)]
    problem = make_problem(matrices, world_size=3)
    plan = solve(problem, "milp", time_limit_s=0.2)
    # One owner per matrix; every matrix in exactly one batch, on its owner's rank; the
    # makespan is the slowest rank's load, at or above the problem's lower bound.
    assert len(plan.owner) == len(matrices) and set(plan.owner) <= {0, 1, 2}
    placed = sorted((i, rank) for rank, ranked in enumerate(plan.ranks) for b in ranked.batches for i in b.matrix_idx)
    assert placed == list(enumerate(plan.owner))
    assert plan.makespan == max(r.load_seconds for r in plan.ranks) >= plan.lower_bound > 0
    assert len(set(plan.owner)) == 3  # 11 matrices over 3 ranks: every rank works
    from dmuon.cli.plan.planner import deserialize

    again = deserialize(problem, plan.serialize())
    assert list(again.owner) == list(plan.owner)
    other = make_problem(matrices, world_size=4)
    with pytest.raises(RuntimeError, match="hash"):
        deserialize(other, plan.serialize())


@pytest.mark.slow
def test_cli_subprocess_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "dmuon", "plan", "--model", "qwen2.5-0.5b", "--world", "64", "--solvers", "lpt"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "lpt" in result.stdout and "world 64" in result.stdout


def test_profiled_costs_are_cached_on_disk(tmp_path, capsys):
    # The engine's NS timings (CPU here, CUDA events on a GPU), median of runs, kept in the store.
    manifest = tmp_path / "tiny.json"
    manifest.write_text(json.dumps({"name": "tiny", "matrices": [
        {"name": "a{i}", "rows": 32, "cols": 64, "count": 5},
        {"name": "e", "rows": 16, "cols": 32, "batch": 4},
    ]}))
    cache = tmp_path / "costs.txt"
    args = ["--manifest", str(manifest), "--world", "2", "--experts", "stack", "--profile", "--profile-runs", "3",
            "--cost-cache", str(cache)]
    first = _plan_json(capsys, *args)
    assert first["cost_model"]["kind"] == "measured"
    # The one measurement store: the autotune cache's format, "ns_time" entries.
    lines = cache.read_text().splitlines()
    assert lines[0] == "dmuon-autotune 1" and lines[1].startswith("env\t") and lines[-1].startswith("end\t5\t")
    entries = [line.split("\t") for line in lines[2:-1]]
    assert all(e[:2] == ["entry", "ns_time"] for e in entries), entries
    # 32x64 at batch sizes 1, 2, 4, 5 and the stack of 4 experts.
    assert sorted((int(e[2]), int(e[3]), int(e[5])) for e in entries) == [
        (16, 32, 4), (32, 64, 1), (32, 64, 2), (32, 64, 4), (32, 64, 5)]
    second = _plan_json(capsys, *args)
    # Same cached costs → same problem hash and plans.
    assert second["problem_hash"] == first["problem_hash"]
    assert second["plans"]["lpt"]["load_s"] == first["plans"]["lpt"]["load_s"]


# ---- Layer spreading (weight-ownership mode) --------------------------------------------


def test_layer_index_from_names():
    from dmuon.cli.plan.planner import layer_ids, layer_index

    assert layer_index("model.layers.12.self_attn.q_proj.weight") == 12
    assert layer_index("layers.3.mlp.experts.5.up_proj") == 3  # the block, not the expert
    assert layer_index("transformer.h.7.attn.c_attn.weight") == 7
    assert layer_index("encoder.layer.2.attention.self.query.weight") == 2
    assert layer_ids(["lm_head.weight", "block0.w", "w[3]", "blocks.4.fc1.weight"]) == [-1, -1, -1, 4]


def test_cli_reports_layer_spreading(capsys):
    # Llama-3.1-8B at D = 8 from LPT: 4 matrices of one layer on one owner before, all 7 of
    # every layer on distinct owners after; publish bytes per owner down to one gate_proj.
    report = _plan_json(capsys, "--model", "llama-3.1-8b", "--world", "8", "--solvers", "lpt,milp")
    gate_bytes = 14336 * 4096 * 2
    lpt = report["plans"]["lpt"]["layer_spread"]
    assert lpt["before"]["num_layers"] == lpt["after"]["num_layers"] == 32
    assert lpt["before"]["max_matrices_per_owner"] == 4
    assert lpt["after"]["max_matrices_per_owner"] == lpt["after"]["matrices_bound"] == 1
    assert lpt["after"]["total_collisions"] == 0
    assert lpt["after"]["max_bytes_per_owner"] == lpt["after"]["bytes_bound"] == gate_bytes
    for plan in report["plans"].values():
        before, after = plan["layer_spread"]["before"], plan["layer_spread"]["after"]
        assert after["max_bytes_per_owner"] <= before["max_bytes_per_owner"]
        assert after["max_bytes_per_owner"] >= after["bytes_bound_for_counts"] >= after["bytes_bound"]
        assert after["max_matrices_per_owner"] >= after["matrices_bound_for_counts"] >= after["matrices_bound"]


def test_cli_text_shows_spreading_and_spread_owners(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--world", "8", "--solvers", "lpt", "--per-rank", "--spread"]) == 0
    out = capsys.readouterr().out
    assert "layer spreading (32 layers" in out and "publish_MB/owner" in out
    assert "4->1 [1/1]" in out  # matrices of the worst layer on one owner: before -> after [bounds]
    assert "lpt: per rank (after layer spreading)" in out
    # --per-rank --spread lists the spread owners: no rank holds two matrices of one layer.
    for line in out.splitlines():
        if line.strip().startswith("rank "):
            layers = re.findall(r"layers\.(\d+)\.", line)
            assert len(layers) == len(set(layers)), line


def test_cli_without_layer_names(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"name": "tiny", "matrices": [{"name": "block{i}.w", "rows": 64, "cols": 256, "count": 4}]}))
    assert main(["plan", "--manifest", str(path), "--world", "2", "--solvers", "lpt"]) == 0
    assert "no layer ids in the matrix names" in capsys.readouterr().out


def test_python_api_spread_layers_keeps_loads_and_round_trips():
    from dmuon.cli.plan.planner import deserialize, layer_spread_stats, spread_layers

    # Layer by layer: plans deal units to ranks in input order, so whole layers share a rank.
    names = [f"model.layers.{l}.{kind}.weight" for l in range(6) for kind in ("q", "k", "v", "o")]
    problem = make_problem([(n, 256, 256, 1) for n in names], world_size=4)
    plan = solve(problem, "lpt")
    spread = spread_layers(problem, plan)
    assert [r.load_seconds for r in spread.ranks] == [r.load_seconds for r in plan.ranks]
    assert spread.makespan == plan.makespan
    assert layer_spread_stats(problem, plan).max_matrices_per_owner == 4
    stats = layer_spread_stats(problem, spread)
    assert stats.max_matrices_per_owner == 1 and stats.total_collisions == 0 and stats.num_layers == 6
    for layer in range(6):  # every layer's 4 matrices on 4 owners
        assert len({spread.owner[i] for i, n in enumerate(names) if f".{layer}." in n}) == 4
    assert list(deserialize(problem, spread.serialize()).owner) == list(spread.owner)
    # Explicit layer ids: all -1 leaves the plan as it was; a wrong length names the argument.
    assert list(spread_layers(problem, plan, [-1] * len(names)).owner) == list(plan.owner)
    with pytest.raises(RuntimeError, match="layer_of has 3 entries"):
        spread_layers(problem, plan, [0, 1, 2])


def test_moe_config_experts_split_into_matrices(capsys):
    # 48 layers × (q, k, v, o, router + 3 stacks of 128 experts).
    # NOTE: the split plan is checked on the manifest: the CLI's layer spreading of 18672
    # matrices without homes takes minutes at small D.
    from dmuon.cli.plan.manifest import load_model, split_experts

    stack = _plan_json(capsys, "--model", _MOE, "--world", "8", "--experts", "stack", "--solvers", "lpt")
    split = split_experts(load_model(_MOE))
    assert stack["num_matrices"] == 48 * 8 and len(split.matrices) == 48 * (5 + 3 * 128)
    names = {m.name for m in split.matrices}
    assert "layers.3.mlp.experts.127.down_proj" in names and "layers.3.mlp.experts.down_proj" not in names
    assert all(m.home == -1 and m.batch == 1 for m in split.matrices)  # no world: no homes


@pytest.mark.parametrize("world", [64, 256])
@pytest.mark.parametrize("cost", ["gpu", "cpu"])
def test_moe_experts_balance_within_ten_percent(capsys, world, cost):
    # Planned as stacks the slowest rank carries 1.27x (D = 64) / 1.69x (D = 256)
    # the mean load; planned expert by expert, with FSDP2 Shard(0) homes, within 1.10.
    extra = ["--cpu"] if cost == "cpu" else []
    report = _plan_json(capsys, "--model", _MOE, "--world", str(world), "--locality", "--solvers", "lpt", *extra)
    lpt = report["plans"]["lpt"]
    assert report["num_homed"] == 48 * 3 * 128
    assert lpt["imbalance"] <= 1.10, lpt["imbalance"]
    # Experts the planner keeps at home receive nothing: the least-loaded receive totals
    # are below what receiving every owned matrix would cost.
    assert 0 < lpt["at_home"] <= report["num_homed"]
    stack = _plan_json(capsys, "--model", _MOE, "--world", str(world), "--experts", "stack", "--solvers", "lpt", *extra)
    assert stack["plans"]["lpt"]["imbalance"] > 1.15  # whole stacks cannot balance


def test_locality_needs_split_experts(capsys):
    assert main(["plan", "--model", _MOE, "--world", "4", "--experts", "stack", "--locality"]) == 2
    assert "--locality needs --experts split" in capsys.readouterr().err


def test_split_experts_homes_follow_torch_chunk():
    from dmuon.cli.plan.manifest import Manifest, Matrix, split_experts

    # 5 experts over 3 ranks: torch.chunk gives 2, 2, 1.
    manifest = Manifest(name="m", matrices=(Matrix(name="l.experts.w", rows=4, cols=6, batch=5),))
    split = split_experts(manifest, world=3)
    import torch

    chunks = torch.arange(5).chunk(3)
    want = [rank for rank, chunk in enumerate(chunks) for _ in chunk]
    assert [m.home for m in split.matrices] == want
    assert [m.name for m in split.matrices] == [f"l.experts.{e}.w" for e in range(5)]
    assert all(m.home == -1 for m in split_experts(manifest).matrices)
    problem = make_problem(split.matrices, world_size=3)
    assert [m.home for m in problem.matrices] == want


def test_cli_reports_backward_stages(capsys):
    # Qwen2.5-1.5B at D = 8, 64 MiB stages: before, every owner's first batch comes from
    # another depth (the planner gives each rank contiguous runs), so the first stage
    # leaves late; after, stage w is backward window w and leaves once backward is through it.
    report = _plan_json(capsys, "--model", "qwen2.5-1.5b", "--world", "8", "--solvers", "lpt")
    stages = report["backward_stages"]
    assert stages["stage_bytes"] == 64 * 2**20 and stages["num_matrices"] == 28 * 7
    before, after = stages["plans"]["lpt"]["before"], stages["plans"]["lpt"]["after"]
    for summary in (before, after):
        assert sum(s["num_matrices"] for s in summary["stages"]) == 28 * 7
        assert all(s["max_s"] >= s["mean_s"] * (1 - 1e-12) > 0 for s in summary["stages"])
    assert after["first_leaves_at"] < before["first_leaves_at"]
    assert after["early_ns_share"] > before["early_ns_share"]
    # In backward order: each stage's matrices come right after the previous stage's.
    rows = after["stages"]
    assert rows[0]["last_matrix"] == 28 * 7 - 1
    assert all(b["last_matrix"] == a["first_matrix"] - 1 for a, b in zip(rows, rows[1:]))
    assert after["worst_max_over_mean"] < before["worst_max_over_mean"]


def test_cli_text_shows_backward_stages(capsys):
    assert main(["plan", "--model", "qwen2.5-0.5b", "--world", "4", "--solvers", "lpt", "--stages"]) == 0
    out = capsys.readouterr().out
    assert "backward stages (step begun from backward, matrices in parameter order; before: 64 MiB stages" in out
    assert "after: windows of whole layers" in out
    assert "lpt before: stage" in out and "lpt after: stage" in out
    assert main(["plan", "--model", "qwen2.5-0.5b", "--world", "1", "--solvers", "lpt"]) == 0
    assert "backward stages" not in capsys.readouterr().out
