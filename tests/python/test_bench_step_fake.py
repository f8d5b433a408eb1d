"""`python -m dmuon bench step --fake-world D` on the CPU: the JSON record (bytes that follow
from the layout, the projection and its model stated), the ranks it runs, HSDP, bad inputs."""

from __future__ import annotations

import json

import pytest

from dist_harness import run_distributed
from dmuon.__main__ import main
from fake_world_workers import analytic_bytes, gloo_fake_world_refused
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
    # NOTE: the fit picks fixed + rate, rate alone or fixed alone by residual; on a busy CPU
    # the tiny shapes' NS time is mostly overhead, so which one wins is timing noise.
    ns_fit = owner["calibration"]["ns"]
    assert ns_fit["rate"] >= 0 and ns_fit["fixed_s"] >= 0 and ns_fit["rate"] + ns_fit["fixed_s"] > 0


def test_hsdp_runs_the_shard_group_of_replica_zero(tmp_path):
    record = _run(tmp_path, "--fake-world", "8", "--hsdp", "2", "--ranks", "all", "--mode", "owner")
    assert record["hsdp"] == {"replicas": 2, "shards": 4} and record["ranks_run"] == [0, 1, 2, 3]
    assert record["methods"]["owner"]["group_size"] == 4


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
