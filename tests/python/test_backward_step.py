"""The sharded step begun inside backward (Execution.backward_step, dmuon.backward_step) on
Gloo CPU processes: the update equals the post-backward step's within 1e-6 of its norm in
FSDP2 (world 2), HSDP (2×2), DDP (world 2) and with 3 accumulated micro-batches (only the
last synced); stages left during backward from the second step on (the first builds the
runtime after backward); a NaN in the last layer's gradient (the first backward hands
over) raises on every rank with nothing written (tests/python/backward_step_workers.py)."""

import pytest

import backward_step_workers
from dist_harness import run_distributed

# NOTE: the same plan and per-matrix math on the CPU ops; only the stages' composition
# differs (backward order), which changes no matrix's arithmetic: held to 1e-6.
TOLERANCE = 1e-6

CASES = [("fsdp2", 2, 1), ("hsdp", 4, 1), ("ddp", 2, 1), ("fsdp2", 2, 3), ("ddp", 2, 3)]


@pytest.mark.parametrize("mode,world,micro", CASES, ids=[f"{m}-w{w}-micro{k}" for m, w, k in CASES])
def test_backward_step_matches_the_post_backward_step(mode, world, micro):
    results = run_distributed(backward_step_workers.backward_matches_post_backward, world, mode, micro)
    assert sorted(results) == list(range(world))
    for rank, result in results.items():
        assert result["backward_on"] and not result["off"], (rank, result)
        assert result["attached"] == ["ddp" if mode == "ddp" else "fsdp2"], result
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (mode, rank, name, error)
        # (early stages, stages, early NS matrices, NS matrices) per step. The first step
        # runs after backward (the runtime is made at step(); step() hands nothing over).
        assert result["early"][0][0] == 0, result["early"]
        for early_stages, stages, _, _ in result["early"][1:]:
            assert 0 < early_stages <= stages, result["early"]


@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("mode", ["fsdp2", "ddp"])
def test_nan_in_a_late_layer_raises_on_every_rank_and_writes_nothing(mode, poison):
    # The begun step is kept (not redone at step()), so the check that refuses it is the
    # one of the work begun inside backward. Catches: that check removed (the begun update
    # would be applied), or a NaN gradient's norm taken as changed (NaN ≠ NaN: then every
    # such step is redone and the check is never reached).
    results = run_distributed(backward_step_workers.nan_in_late_layer, 2, mode, poison)
    for rank, result in results.items():
        assert result["early_open"], (rank, result)
        assert result["redone"] == [False], (rank, result)
        assert "non-finite gradient" in result["error"] and "layers.3.weight" in result["error"], (rank, result)
        assert result["unchanged"], (rank, result)


def test_gradients_clipped_after_backward_are_stepped_as_clipped():
    # NOTE: clip_grad_norm_ scales FSDP2's DTensor gradients in place without moving their
    # version counters; step() sees the values changed and redoes the step on them.
    results = run_distributed(backward_step_workers.backward_matches_post_backward, 2, "fsdp2", 1, True)
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)


def test_stage_spread_plan_matches_the_post_backward_step():
    # Six same-shape layers at world 2, an FSDP2 unit per pair: the planner gives rank 0 the
    # first three and rank 1 the last three; begun from backward, each backward window (a
    # unit) is spread over both ranks (same counts per rank), so owners differ while every
    # update stays the post-backward step's within 1e-6.
    results = run_distributed(backward_step_workers.spread_plan_matches_post_backward, 2)
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        on, off = result["owners"][True], result["owners"][False]
        assert on != off, result["owners"]
        assert sorted(on) == sorted(off), result["owners"]  # same matrices per rank
        assert off[:6] == [0, 0, 0, 1, 1, 1], off
        assert all(on[k] != on[k + 1] for k in (0, 2, 4)), on
        for early_stages, stages in result["early"][1:]:
            assert 0 < early_stages <= stages and stages > 1, result["early"]


@pytest.mark.parametrize("clip", [False, True], ids=["no-clip", "clip"])
def test_default_options_start_most_of_an_8_block_models_ns_inside_backward(clip):
    # NOTE: the stages are the FSDP2 groups (one per block), not 64 MiB of wire: at the
    # default bucket size the whole model used to be one stage (0 of 24 NS matrices per
    # rank inside backward). From the second step on (the first makes the runtime after
    # backward) at least half of every rank's NS runs before backward ends; a clip that
    # scales the gradients makes step() drop the begun work and redo it all, exactly.
    results = run_distributed(backward_step_workers.default_blocks_match_post_backward, 2, clip)
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        assert result["stages"] == 8 and result["warnings"] == [], (rank, result)
        assert result["shares"][0] == 0, result["shares"]
        for share in result["shares"][1:]:
            assert share == 0 if clip else share >= 0.5, (rank, result["shares"])


def test_one_fsdp2_unit_for_the_whole_model_is_warned_about_once():
    results = run_distributed(backward_step_workers.default_blocks_match_post_backward, 2, False, "root")
    for rank, result in results.items():
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (rank, name, error)
        assert result["stages"] == 1 and all(share == 0 for share in result["shares"]), result
        # NOTE: rank 0 warns; the message names the option and what to set.
        if rank == 0:
            assert len(result["warnings"]) == 1, result["warnings"]
            assert "holds 48 of 48 matrices" in result["warnings"][0]
            assert "fully_shard to each block" in result["warnings"][0]
            assert "backward_step=False" in result["warnings"][0]
        else:
            assert result["warnings"] == []
