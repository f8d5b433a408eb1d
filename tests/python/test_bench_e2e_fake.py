"""`python -m dmuon bench e2e --fake-world D` on the CPU (dmuon's tiny GPT under FSDP2 over
the fake backend): FSDP2's collectives counted exactly (bytes from the model's shards),
HSDP's all-reduce, the projected table, bad arguments."""

from __future__ import annotations

import json

import pytest

from dmuon.__main__ import main

_TINY = ["bench", "e2e", "--model", "tiny", "--device", "cpu", "--seq", "16", "--steps", "1", "--warmup", "1",
         "--micro-batch", "1"]


def _padded_bytes(params, world: int) -> int:
    """float32 bytes of `params` with dim 0 padded to a multiple of the world (FSDP2's shards)."""
    total = 0
    for p in params:
        rest = p.numel() // p.shape[0]
        total += -(-p.shape[0] // world) * world * rest * 4
    return total


def _tiny_units() -> tuple[list, list]:
    """The tiny GPT's parameters per FSDP2 unit: the decoder blocks, and the rest (the root)."""
    from dmuon.bench.e2e_models import model_spec

    spec = model_spec("tiny", 16)
    model = spec.build()
    blocks = spec.blocks(model)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    return [list(b.parameters()) for b in blocks], [p for p in model.parameters() if id(p) not in in_blocks]


def test_one_rank_of_a_fake_world_counts_fsdp2s_collectives_and_projects_each_optimizer(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main([*_TINY, "--fake-world", "4", "--rank", "2", "--optimizers", "dmuon,gather,adamw",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "--fake-world 4, rank 2" in printed and "step projected" in printed
    record = json.loads(out.read_text())
    assert record["world"] == 4 and record["rank"] == 2
    blocks, root = _tiny_units()
    by_kind = record["fsdp"]["by_kind"]
    # One reduce-scatter per unit of its padded float32 gradients; the blocks' weights are
    # gathered in forward and again in backward (they reshard after forward), the root's once.
    assert by_kind["reduce_scatter"]["count"] == len(blocks) + 1
    assert by_kind["reduce_scatter"]["bytes"] == _padded_bytes([p for b in blocks for p in b] + root, 4)
    assert by_kind["all_gather"]["count"] == 2 * len(blocks) + 1
    assert by_kind["all_gather"]["bytes"] == _padded_bytes([p for b in blocks for p in b] * 2 + root, 4)
    assert set(by_kind) == {"all_gather", "reduce_scatter"} and by_kind["all_gather"]["group_sizes"] == [4]
    optimizers = record["optimizers"]
    assert set(optimizers) == {"dmuon", "gather", "adamw"}
    for name, o in optimizers.items():
        assert o["fwd_bwd_projected_ms"] >= o["fwd_bwd_ms"] > 0, name
        # NOTE: world 4: the step begun inside backward is modelled (auto: on), hiding waits.
        assert o["opt_left_after_backward_ms"] <= o["opt_projected_ms"], name
        assert o["projected_step_ms"] == pytest.approx(o["fwd_bwd_projected_ms"] + o["opt_left_after_backward_ms"]), name
    # DMuon's exchange was simulated from this rank's pipeline; AdamW's step has none.
    assert optimizers["dmuon"]["muon"]["simulated_s"] > 0 and optimizers["dmuon"]["muon"]["bytes_sent"] > 0
    assert optimizers["adamw"]["opt_projected_ms"] == optimizers["adamw"]["opt_ms"]
    assert "latency + bytes / bandwidth" in record["projection_model"]


def test_hsdp_adds_the_replicas_all_reduce(tmp_path):
    out = tmp_path / "hsdp.json"
    assert main([*_TINY, "--fake-world", "4", "--hsdp", "2", "--optimizers", "adamw", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    by_kind = record["fsdp"]["by_kind"]
    assert record["mesh"] == {"replicas": 2, "shards": 2}
    assert by_kind["all_gather"]["group_sizes"] == [2] and by_kind["all_reduce"]["group_sizes"] == [2]
    blocks, root = _tiny_units()
    # The all-reduce across replicas carries each rank's reduce-scattered shard (1/2).
    assert by_kind["all_reduce"]["bytes"] == _padded_bytes([p for b in blocks for p in b] + root, 2) // 2


@pytest.mark.parametrize("argv, message", [
    (["--fake-world", "2", "--world", "2"], "cannot be combined with --world"),
    (["--fake-world", "2", "--rank", "2"], r"--rank 2 is outside the fake world of 2 \(ranks 0..1\)"),
    (["--fake-world", "0"], "--fake-world must be >= 1"),
    (["--rank", "1"], "--rank needs --fake-world"),
])
def test_bad_arguments_name_the_argument(argv, message):
    with pytest.raises(ValueError, match=message):
        main([*_TINY, *argv])


def test_the_weight_ownership_mode_is_refused_by_name(tmp_path):
    with pytest.raises(RuntimeError, match="weight-ownership mode .* cannot run over torch's fake"):
        main([*_TINY, "--fake-world", "2", "--optimizers", "dmuon-ownership"])


def test_backward_step_projection_hides_the_waits_of_every_stage_but_the_last():
    from dmuon.bench.e2e_fake import backward_step_left

    # 4 stages: 3 leave inside backward, 3/4 of the 4 ms of waits hide.
    assert backward_step_left(0.010, 0.004, 4) == pytest.approx(0.007)
    # One stage leaves at step(): nothing hides; waits never make the step negative.
    assert backward_step_left(0.010, 0.004, 1) == 0.010
    assert backward_step_left(0.001, 0.004, 2) == 0.0
