"""`python -m dmuon bench step --fake-world D` on the CPU: the JSON record (bytes that follow
from the layout, the projection and its model stated), the ranks it runs, HSDP, bad inputs."""

from __future__ import annotations

import json

import pytest

from dist_harness import run_distributed
from dmuon.cli.main import main
from test_fake_world import analytic_bytes, gloo_fake_world_refused
from test_bench_step import _MANIFEST

# The manifest of test_bench_step (square, wide, tall, a 3-D stack, one row: empty shards at 4) as shapes.
_SHAPES = [(48, 48)] * 2 + [(72, 48)] * 2 + [(48, 72), (3, 16, 24), (1, 40)]


def _run(tmp_path, *argv: str) -> dict:
    manifest = tmp_path / "small.json"
    manifest.write_text(json.dumps(_MANIFEST))
    out = tmp_path / "fake.json"
    assert main(["bench", "step", "--manifest", str(manifest), "--device", "cpu", "--steps", "1", "--warmup", "1",
                 "--bucket-mb", "0.01", "--json", str(out), *argv]) == 0
    return json.loads(out.read_text())


def test_every_rank_of_a_fake_world_of_four(tmp_path, capsys):
    record = _run(tmp_path, "--fake-world", "4", "--ranks", "all", "--gpus-per-node", "2")
    printed = capsys.readouterr().out
    assert "dmuon bench step --fake-world 4" in printed and "projected ms" in printed
    assert record["world"] == 4 and record["model"] == "small" and record["ranks_run"] == [0, 1, 2, 3]
    assert record["topology"]["gpus_per_node"] == 2 and "latency + bytes / bandwidth" in record["projection_model"]
    methods = record["methods"]
    assert set(methods) == {"owner", "gather", "adamw"}
    owner, gather = methods["owner"], methods["gather"]
    # Every rank ran, so nothing was predicted; owners come from rank 0's plan.
    assert owner["predicted_ranks"] == [] and set(owner["per_rank"]) == {"0", "1", "2", "3"}
    for method in (owner, gather):
        assert method["projected_step_ms"] > 0 and method["measured_compute_ms"] > 0 and method["ns_ms"] > 0
        assert method["projected_step_ms"] >= method["wait_ms"]
    for rank, entry in gather["per_rank"].items():
        sent, received = analytic_bytes(_SHAPES, [], int(rank), 4, "gather")
        assert (entry["send_bytes"], entry["recv_bytes"]) == (sent, received), rank
        # Two GPUs per node: the bytes to the rank's node neighbour travel inside the node.
        assert entry["send_intra"] + entry["send_inter"] == sent and entry["send_inter"] > entry["send_intra"] > 0
    planner = record["planner_prediction"]
    assert planner["predicted_ns_ms"] > 0 and planner["measured_ns_ms"] > 0
    assert methods["adamw"]["projected_step_ms"] == methods["adamw"]["measured_step_ms"]


def test_the_default_runs_rank_zero_and_the_rank_the_planner_predicts_slowest(tmp_path):
    record = _run(tmp_path, "--fake-world", "8", "--mode", "owner")
    slowest = record["planner_prediction"]["slowest_rank"]
    assert record["ranks_run"] == sorted({0, slowest}, key=lambda r: (r != 0, r))
    owner = record["methods"]["owner"]
    assert owner["rank"] == slowest and set(record["methods"]) == {"owner", "adamw"}
    # The ranks not run are predicted from the measured ones.
    assert sorted(owner["predicted_ranks"]) == sorted(set(range(8)) - {0, slowest})
    # The one-GPU NS of the reported rank times the matrices its plan gives it (never none).
    assert owner["local_ns_items"] == [i for i, o in enumerate(owner["item_owners"]) if o == slowest] != []
    # NOTE: the fit picks fixed + rate, rate alone or fixed alone by residual; on a busy CPU
    # the tiny shapes' NS time is mostly overhead, so which one wins is timing noise.
    ns_fit = owner["calibration"]["ns"]
    assert ns_fit["rate"] >= 0 and ns_fit["fixed_s"] >= 0 and ns_fit["rate"] + ns_fit["fixed_s"] > 0


def test_hsdp_plans_over_the_whole_world_and_replicas_send_once(tmp_path):
    # HSDP takes the mesh layout on the whole world, as a real 2-D mesh does: owners may lie in
    # either replica, and a replica that owns nothing sends nothing (the lowest holder sends).
    record = _run(tmp_path, "--fake-world", "8", "--hsdp", "2", "--ranks", "all", "--mode", "owner")
    assert record["hsdp"] == {"replicas": 2, "shards": 4} and record["ranks_run"] == list(range(8))
    owner = record["methods"]["owner"]
    assert owner["group_size"] == 8
    owners = set(owner["item_owners"])
    assert owners <= set(range(8)) and any(r >= 4 for r in owners), owner["item_owners"]
    for rank in range(4, 8):
        if rank not in owners:
            assert owner["per_rank"][str(rank)]["send_bytes"] == 0, rank


@pytest.mark.parametrize("argv, error, message", [
    (["--fake-world", "0"], ValueError, "--fake-world must be >= 1, got 0"),
    (["--fake-world", "4", "--rank", "4"], ValueError, r"--rank 4 is outside the fake world of 4 \(ranks 0..3\)"),
    (["--fake-world", "3", "--hsdp", "2"], ValueError, "--hsdp must be a positive divisor of --fake-world 3"),
    (["--fake-world", "2", "--world", "2"], ValueError, "cannot be combined with --world"),
    (["--rank", "1"], ValueError, "--rank needs --fake-world"),
    (["--fake-world", "2", "--mode", "owner,bogus"], ValueError, "--mode must be 'all' or a comma list"),
    (["--fake-world", "2", "--intra-gbps", "0"], ValueError, r"--intra-gbps must be > 0 \(Gb/s\)"),
    # Qwen2.5-7B's 6.5 G Muon parameters at world 2: 3.26 G elements on rank 0, 16 bytes each.
    (["--fake-world", "2", "--memory-budget-gb", "1", "--model", "qwen2.5-7b"], ValueError,
     r"--model qwen2.5-7b at --fake-world 2 \(rank 0: \d+ float32 elements .* does not fit the device: it needs "
     r"5\d\.\d\d GB \(\d+ bytes\), 1\.00 GB \(1000000000 bytes\) are available \(--memory-budget-gb 1\)"),
])
def test_bad_arguments_name_the_argument(argv, error, message):
    base = ["bench", "step", "--device", "cpu"] + ([] if "--model" in argv else ["--model", "qwen2.5-0.5b"])
    with pytest.raises(error, match=message):
        main(base + argv)


def test_fake_world_is_refused_where_a_real_process_group_is_initialized():
    argv = ["bench", "step", "--model", "qwen2.5-0.5b", "--device", "cpu", "--fake-world", "2"]
    errors = run_distributed(gloo_fake_world_refused, 2, argv)
    for rank, error in errors.items():
        assert "--fake-world needs a process without an initialized process group, but one is initialized " \
               f"(backend 'gloo', rank {rank} of 2)" in error, error


# --fake-mesh: torchtitan's names (colwise q/k/v/up, rowwise o/down, one matrix TP does not
# split), uneven rows (k: 18) and an empty piece (v: 3 rows on 2 x 2).
_MESH_MANIFEST = {"name": "tiny-tp", "matrices": [
    {"name": "layers.{i}.self_attn.q_proj", "rows": 48, "cols": 48, "count": 2},
    {"name": "layers.0.self_attn.k_proj", "rows": 18, "cols": 48},
    {"name": "layers.0.self_attn.v_proj", "rows": 3, "cols": 48},
    {"name": "layers.0.self_attn.o_proj", "rows": 48, "cols": 40},
    {"name": "layers.0.mlp.up_proj", "rows": 72, "cols": 48},
    {"name": "layers.0.mlp.down_proj", "rows": 48, "cols": 72},
    {"name": "layers.0.mlp.router_proj", "rows": 40, "cols": 48},
]}
_MESH_SHAPES = [(48, 48), (48, 48), (18, 48), (3, 48), (48, 40), (72, 48), (48, 72), (40, 48)]
_MESH_STYLES = ["colwise"] * 4 + ["rowwise", "colwise", "rowwise", "replicate"]


def _span(size: int, index: int, parts: int) -> tuple[int, int]:
    """(begin, count) of torch.chunk's piece `index`."""
    step = -(-size // parts)
    begin = min(index * step, size)
    return begin, min(begin + step, size) - begin


def _mesh_box(shape, style: str, d: int, t: int, dp: int, tp: int) -> tuple:
    """((row begin, rows), (col begin, cols)) of mesh coordinates (d, t), written from the
    placements: colwise rows = DP-chunk d of TP-chunk t; rowwise rows by DP, columns by TP;
    replicate rows by DP only."""
    rows, cols = shape
    if style == "colwise":
        outer_begin, outer = _span(rows, t, tp)
        begin, count = _span(outer, d, dp)
        return (outer_begin + begin, count), (0, cols)
    if style == "rowwise":
        return _span(rows, d, dp), _span(cols, t, tp)
    return _span(rows, d, dp), (0, cols)


def _mesh_bytes(rank: int, dp: int, tp: int, mode: str, owners: list[int]) -> tuple[int, int]:
    """(sent, received) bytes of `rank`, float32 on the wire: a rank that computes a matrix it
    does not hold whole receives every block it lacks once, from the block's lowest holder;
    in owner mode the owner returns every other rank its block of the result."""
    world = dp * tp
    sent = received = 0
    for i, (shape, style) in enumerate(zip(_MESH_SHAPES, _MESH_STYLES)):
        boxes = [_mesh_box(shape, style, r // tp, r % tp, dp, tp) for r in range(world)]
        numel = [b[0][1] * b[1][1] for b in boxes]
        lowest = [min(s for s in range(world) if boxes[s] == boxes[r]) for r in range(world)]
        computers = range(world) if mode == "gather" else [owners[i]]
        for dst in computers:
            if numel[dst] == shape[0] * shape[1]:
                continue
            for src in range(world):
                if src != dst and numel[src] and boxes[src] != boxes[dst] and lowest[src] == src:
                    sent += numel[src] if src == rank else 0
                    received += numel[src] if dst == rank else 0
        if mode == "owner":
            for dst in range(world):
                if dst != owners[i] and numel[dst]:
                    sent += numel[dst] if owners[i] == rank else 0
                    received += numel[dst] if dst == rank else 0
    return 4 * sent, 4 * received


def test_a_fake_mesh_of_fsdp_by_tp_projects_the_mesh_layouts_bytes(tmp_path, capsys):
    manifest = tmp_path / "tiny_tp.json"
    manifest.write_text(json.dumps(_MESH_MANIFEST))
    out = tmp_path / "mesh.json"
    assert main(["bench", "step", "--manifest", str(manifest), "--device", "cpu", "--steps", "1", "--warmup", "1",
                 "--bucket-mb", "0.01", "--json", str(out), "--fake-mesh", "2x2", "--gpus-per-node", "2"]) == 0
    record = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "dmuon bench step --fake-mesh 2x2 (world 4: FSDP2 2 x TP 2)" in printed
    assert "5 colwise (_StridedShard(0), Shard(0)), 2 rowwise (Shard(0), Shard(1)), 1 replicate" in printed
    assert record["world"] == 4 and record["fake_mesh"]["styles"] == _MESH_STYLES
    slowest = record["planner_prediction"]["slowest_rank"]
    assert record["ranks_run"] == sorted({0, slowest}, key=lambda r: (r != 0, r))
    for mode in ("owner", "gather"):
        method = record["methods"][mode]
        # DMuon's group is the union of the mesh, the whole fake world; the ranks not run are predicted.
        assert method["group_size"] == 4 and method["simulated_step_s"] > 0 and method["projected_step_ms"] > 0
        assert sorted(method["predicted_ranks"]) == sorted(set(range(4)) - set(record["ranks_run"]))
        owners = [method["item_owners"][method["item_params"].index(p)] for p in range(len(_MESH_SHAPES))]
        if mode == "owner":
            assert all(0 <= o < 4 for o in owners)
        for rank in record["ranks_run"]:
            entry = method["per_rank"][str(rank)]
            assert (entry["send_bytes"], entry["recv_bytes"]) == _mesh_bytes(rank, 2, 2, mode, owners), (mode, rank)
            assert entry["send_intra"] + entry["send_inter"] == entry["send_bytes"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--fake-mesh", "2x1"], r"--fake-mesh 2x1: DP must be >= 1 and TP >= 2"),
    (["--fake-mesh", "8"], r"--fake-mesh must be DPxTP with two positive integers \(e.g. 8x8\), got '8'"),
    (["--fake-mesh", "2x2", "--fake-world", "8"], r"--fake-world 8 disagrees with --fake-mesh 2x2 \(a world of 4\)"),
    (["--fake-mesh", "2x2", "--hsdp", "2"], "--fake-mesh places FSDP2 x TP; it cannot be combined with --hsdp"),
    (["--fake-mesh", "2x2", "--rank", "4"], r"--rank 4 is outside the fake world of 4"),
])
def test_bad_fake_mesh_arguments_name_the_argument(argv, message):
    with pytest.raises(ValueError, match=message):
        main(["bench", "step", "--device", "cpu", "--model", "qwen2.5-0.5b", *argv])
