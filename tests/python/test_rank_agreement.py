"""What the ranks must agree on raises on every rank, with a name, instead of hanging or
training wrongly: replicas that differ, param groups added on some ranks only, one rank's
failed checks, an AdamW gradient on some ranks only; and row-block matrices sharded across
ranks step as in one process."""

from __future__ import annotations

import contract_workers
from dist_harness import run_distributed


def test_replicas_that_differ_are_refused_and_local_trains_each_rank_alone():
    results = run_distributed(contract_workers.replicas_that_differ_are_refused, 2)
    for rank, out in results.items():
        assert "'embed_tokens.weight'" not in out["error"]  # AdamW parameters are not replicas DMuon syncs
        assert "parameter 'q_proj.weight' differs across the 2 ranks" in out["error"], out["error"]
        assert "process_group='local'" in out["error"] and "DDP" in out["error"]
        assert out["runtime_world"] == 1
        assert out["max_error"] < 1e-5, (rank, out["max_error"])


def test_equal_replicas_pass_the_check():
    assert run_distributed(contract_workers.equal_replicas_pass, 2) == {0: 2, 1: 2}


def test_add_param_group_on_some_ranks_raises_on_every_rank_naming_the_group():
    results = run_distributed(contract_workers.add_param_group_on_some_ranks, 2)
    for rank, out in results.items():
        assert "param group 2 (Muon, 1 parameter(s), first 'extra.weight' (8, 8)) exists on rank(s) [0] but not " \
               "on rank(s) [1]" in out["error"], (rank, out["error"])
        assert "add_param_group" in out["error"]
        assert out["unchanged"]


def test_an_adamw_gradient_on_some_ranks_only_raises_on_every_rank_naming_it():
    results = run_distributed(contract_workers.adamw_gradient_on_some_ranks_only, 2)
    for rank, out in results.items():
        assert out["adamw"], rank
        assert "parameter 'embed_tokens.weight' (checked with the step) has a gradient on 1 of 2 ranks at step 1; " \
               "every rank must have it or none" in out["error"], (rank, out["error"])
        assert out["unchanged"], rank


def test_one_ranks_failed_check_raises_on_every_rank_before_any_write():
    results = run_distributed(contract_workers.a_failed_check_on_one_rank_stops_every_rank, 2)
    assert "'lm_head.weight'" in results[1]["error"] and "exp_avg has shape [3, 3]" in results[1]["error"]
    assert "rank 1 failed its checks" in results[0]["error"] and "'lm_head.weight'" in results[0]["error"]
    assert results[0]["unchanged"] and results[1]["unchanged"]


def test_row_blocks_sharded_across_ranks_match_the_reference():
    results = run_distributed(contract_workers.row_blocks_sharded_match_the_reference, 2)
    for rank, out in results.items():
        assert out["qkv_blocks"] == (5, 5, 5)
        assert out["gqa_blocks"] == (8, 4, 4)
        # Rank 0 holds rows 0–7 of the fused q, k, v: a block boundary runs through its shard.
        assert out["local_rows"]["attn.in_proj_weight"] == (8 if rank == 0 else 7)
        for name, error in out["errors"].items():
            assert error < 1e-5, (rank, name, error)
