"""`python -m dmuon bench e2e` on CPU processes over Gloo (dmuon's tiny GPT under FSDP2):
the table and JSON, the micro-batch search after running out of memory, the optimizer
registry's prepare-before-fully_shard hook, the Hugging Face config table against the
shipped manifests, and bad arguments."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections import Counter

import pytest
import torch

from dist_harness import run_distributed
from dmuon.cli.main import main
from dmuon.cli.bench.e2e_models import HF_CONFIGS
from dmuon.cli.plan.manifest import load_model, manifest_from_config

_TINY_RUN = ["bench", "e2e", "--model", "tiny", "--device", "cpu", "--seq", "16", "--steps", "2", "--warmup", "1"]


@pytest.mark.slow
def test_tiny_model_on_two_gloo_ranks_prints_every_optimizer_against_adamw(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main([*_TINY_RUN, "--world", "2", "--micro-batch", "2", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("optimizer"))
    rows = {line.split()[0]: line.split() for line in lines[header + 2:header + 5]}
    assert set(rows) == {"dmuon", "gather", "adamw"}
    assert rows["adamw"][-1] == "+0.00%" and rows["dmuon"][-1].endswith("%")
    assert any("micro-batch 2 per rank (given)" in line and "FSDP2" not in line for line in lines)

    record = json.loads(out.read_text())
    assert record["micro_batch"] == 2 and record["config"]["world"] == 2
    for name, entry in record["slowest_rank"].items():
        assert entry["step_s"] >= entry["opt_s"] > 0 and entry["fwd_bwd_s"] > 0, name
        assert torch.isfinite(torch.tensor(entry["loss"])), name
    assert record["param_counts"]["muon_matrices"] == 12  # 2 blocks x (q, k, v, o, up, down)
    assert set(record["per_rank"]) == {"0", "1"}


def _running_out(rank: int, runs_out, predicted: int | None = None) -> None:
    """bench e2e on this rank: a step whose batch of `tokens` `runs_out(rank, tokens)` raises
    torch's out-of-memory error; the micro-batch prediction says `predicted` (None: as is)."""
    import dmuon.cli.bench.e2e as e2e
    from dmuon.cli.bench import e2e_models

    real = e2e_models.model_spec

    def spec_that_runs_out(name, seq):
        spec = real(name, seq)

        def loss(model, tokens):
            if runs_out(rank, tokens):
                raise torch.cuda.OutOfMemoryError("simulated: out of memory")
            return spec.loss(model, tokens)

        return dataclasses.replace(spec, loss=loss)

    e2e_models.model_spec = spec_that_runs_out
    if predicted is not None:
        e2e._Run.predict_micro_batch = lambda self: (predicted, {"predicted": predicted})


def _runs_out_above_three_sequences(rank: int, world: int) -> dict:
    """Every rank runs out of memory with more than 3 sequences and the prediction says 6:
    the search must agree on 5, 4, then settle on 3."""
    import dmuon.cli.bench.e2e as e2e

    _running_out(rank, lambda r, tokens: tokens.shape[0] > 3, predicted=6)
    config = dict(model="tiny", device="cpu", seq=8, micro_batch=None, max_micro_batch=64,
                  optimizers=["adamw", "dmuon"], steps=1, warmup=0, seed=0)
    return e2e._worker(rank, world, config)


@pytest.mark.slow
def test_out_of_memory_makes_every_rank_step_down_the_micro_batch():
    for rank, result in run_distributed(_runs_out_above_three_sequences, 2).items():
        assert result["micro_batch"] == 3 and result["out_of_memory_at"] == [6, 5, 4], (rank, result)
        assert set(result["optimizers"]) == {"adamw", "dmuon"}


def _rank0_runs_out_alone(rank: int, world: int) -> dict:
    """Rank 0 runs out of memory inside its first step, rank 1 does not (memory can differ by
    rank): rank 0 must report it within the agreement timeout instead of hanging."""
    import dmuon.cli.bench.e2e as e2e

    _running_out(rank, lambda r, tokens: r == 0)
    # NOTE: agree_timeout_s as _AGREE_TIMEOUT_S below, but under the test's collective_timeout_s (8 s).
    config = dict(model="tiny", device="cpu", seq=8, micro_batch=2, max_micro_batch=64, optimizers=["adamw"],
                  steps=1, warmup=0, seed=0, agree_timeout_s=6.0)
    return e2e._worker(rank, world, config)


@pytest.mark.slow
def test_a_rank_that_runs_out_alone_is_reported_not_hung():
    # NOTE: a hang ends in the harness's TimeoutError (timeout_s), never in these messages.
    results = run_distributed(_rank0_runs_out_alone, 2, collective_timeout_s=8, timeout_s=60, expect_errors=True)
    assert "rank 0: this rank ran out of GPU memory (adamw at micro-batch 2, seq 8)" in results[0], results[0]
    assert "pass a smaller --micro-batch" in results[0], results[0]
    assert isinstance(results[1], str), results[1]  # rank 1 failed too (its collective timed out)


# NOTE: long enough that a rank slow to build its model (spawned ranks start seconds apart
# on a loaded 2-core machine; 2 s timed out there) still reaches each agreement in time.
_AGREE_TIMEOUT_S = 10.0


def _rank0_runs_out_alone_above_two(rank: int, world: int, config: dict) -> dict:
    """bench e2e's worker where rank 0 alone runs out of memory with more than 2 sequences
    and the prediction says 4."""
    import dmuon.cli.bench.e2e as e2e

    _running_out(rank, lambda r, tokens: r == 0 and tokens.shape[0] > 2, predicted=4)
    return e2e._worker(rank, world, config)


@pytest.mark.slow
def test_a_rank_that_runs_out_alone_restarts_every_rank_at_a_smaller_micro_batch(capsys):
    import dmuon.cli.bench.e2e as e2e

    config = dict(model="tiny", device="cpu", seq=8, micro_batch=None, max_micro_batch=64, optimizers=["adamw"],
                  steps=1, warmup=0, seed=0, agree_timeout_s=_AGREE_TIMEOUT_S, abort_after_failure_s=1.0)
    results = e2e._launch_until_it_fits(config, 2, 120.0, worker=_rank0_runs_out_alone_above_two)
    for rank, result in results.items():
        assert result["micro_batch"] == 2 and result["out_of_memory_at"] == [4, 3], (rank, result)
        assert result["optimizers"]["adamw"] is not None
    out = capsys.readouterr().out
    assert "ran out of memory alone at micro-batch 4; restarting every rank at 3" in out, out


@pytest.mark.slow
def test_a_lone_out_of_memory_at_a_given_micro_batch_is_not_retried():
    import dmuon.cli.bench.e2e as e2e
    from dmuon.cli.launch import RankFailed

    config = dict(model="tiny", device="cpu", seq=8, micro_batch=3, max_micro_batch=64, optimizers=["adamw"],
                  steps=1, warmup=0, seed=0, agree_timeout_s=_AGREE_TIMEOUT_S, abort_after_failure_s=1.0)
    with pytest.raises(RankFailed, match="(?s)rank 0 of 2 failed.*pass a smaller --micro-batch"):
        e2e._launch_until_it_fits(config, 2, 120.0, worker=_rank0_runs_out_alone_above_two)


def _prepare_sees_the_unsharded_model(rank: int, world: int) -> dict:
    """A registry entry with a prepare hook, as the weight-ownership mode will have."""
    import dmuon.cli.bench.e2e as e2e
    from dmuon.cli.bench.e2e_optimizers import OPTIMIZERS, OptimizerEntry
    from torch.distributed.tensor import DTensor

    seen = {}

    def prepare(model, mesh, settings):
        seen["prepared_dtensors"] = any(isinstance(p, DTensor) for p in model.parameters())
        seen["mesh_size"] = mesh.size()
        return {"ignored_params": {model.lm_head.weight}}  # passed to every fully_shard call

    def build(model, settings):
        seen["lm_head_sharded"] = isinstance(model.lm_head.weight, DTensor)
        seen["others_sharded"] = all(isinstance(p, DTensor) for n, p in model.named_parameters() if n != "lm_head.weight")
        return torch.optim.SGD(model.parameters(), lr=settings.adamw_lr)

    OPTIMIZERS["prepared"] = OptimizerEntry(description="test", prepare=prepare, build=build)
    config = dict(model="tiny", device="cpu", seq=8, micro_batch=1, max_micro_batch=64,
                  optimizers=["prepared"], steps=1, warmup=0, seed=0)
    result = e2e._worker(rank, world, config)
    return {**seen, "step_s": result["optimizers"]["prepared"]["step_s"]}


def test_an_entry_prepares_the_model_before_fully_shard_and_passes_it_arguments():
    for rank, seen in run_distributed(_prepare_sees_the_unsharded_model, 2).items():
        assert seen["prepared_dtensors"] is False and seen["others_sharded"] is True, (rank, seen)
        assert seen["lm_head_sharded"] is False, (rank, seen)
        assert seen["mesh_size"] == 2 and seen["step_s"] > 0


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_configs_have_the_shipped_manifests_muon_matrices(name):
    _, values = HF_CONFIGS[name]
    from_config = manifest_from_config(values, name=name)
    shapes = Counter((m.rows, m.cols, m.batch) for m in from_config.matrices)
    assert shapes == Counter((m.rows, m.cols, m.batch) for m in load_model(name).matrices)


def _small_qwen2_under_fsdp2(rank: int, world: int) -> dict:
    """The Hugging Face path (config -> model -> FSDP2 per decoder layer -> loss) on a
    scaled-down Qwen2 config."""
    import dmuon.cli.bench.e2e as e2e
    from dmuon.cli.bench import e2e_models

    e2e_models.HF_CONFIGS["qwen2-small"] = ("qwen2", dict(
        vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
        hidden_act="silu"))
    config = dict(model="qwen2-small", device="cpu", seq=32, micro_batch=2, max_micro_batch=64,
                  optimizers=["dmuon", "adamw"], steps=1, warmup=1, seed=0)
    return e2e._worker(rank, world, config)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_hugging_face_decoder_trains_under_fsdp2():
    for rank, result in run_distributed(_small_qwen2_under_fsdp2, 2).items():
        assert result["param_counts"]["muon_matrices"] == 14, (rank, result)  # 2 layers x q, k, v, o, gate, up, down
        for name, entry in result["optimizers"].items():
            assert entry["step_s"] > 0 and 0 < entry["loss"] < 20, (rank, name, entry)


def test_hugging_face_model_without_transformers_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # NOTE: `import transformers` raises ImportError
    with pytest.raises(ImportError, match="--model qwen2.5-1.5b .* needs the 'transformers' package"):
        main(["bench", "e2e", "--model", "qwen2.5-1.5b", "--device", "cpu", "--world", "1"])


@pytest.mark.parametrize("argv, message", [
    (["--micro-batch", "0"], "--micro-batch must be 'auto' or a positive integer"),
    (["--optimizers", "dmuon,sgd"], r"--optimizers: unknown \['sgd'\]"),
    (["--optimizers", "adamw,adamw"], "--optimizers lists a name twice"),
    (["--optimizers", ","], "--optimizers must name at least one"),
    (["--seq", "1"], "--seq must be >= 2"),
    (["--world", "0"], "--world must be >= 1"),
])
def test_bad_arguments_name_the_argument(argv, message):
    with pytest.raises(ValueError, match=message):
        main([*_TINY_RUN, *argv])


@pytest.mark.parametrize("switch", ["on", "off"])
def test_backward_step_switch_reports_the_share_of_ns_inside_backward(tmp_path, capsys, switch):
    out = tmp_path / "e2e.json"
    assert main([*_TINY_RUN, "--world", "2", "--micro-batch", "1", "--optimizers", "dmuon",
                 "--backward-step", switch, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    entry = json.loads(out.read_text())["slowest_rank"]["dmuon"]
    assert entry["backward_step"] is (switch == "on")
    if switch == "on":
        # NOTE: every stage but the last leaves inside backward (a stage per block); the
        # share is the lowest rank's, a fraction in (0, 1], and each rank's is printed.
        assert 0 < entry["hidden"] <= 1, entry
        per_rank = json.loads(out.read_text())["per_rank"]
        assert sorted(per_rank) == ["0", "1"] and all(0 < r["dmuon"]["hidden"] <= 1 for r in per_rank.values())
        assert "matrices ran before backward ended (step begun from backward; median step): rank 0 " in text
        assert ", rank 1 " in text
    else:
        assert entry["hidden"] is None, entry


def test_at_world_1_the_step_begun_from_backward_runs_every_ns_inside_it(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main([*_TINY_RUN, "--world", "1", "--micro-batch", "1", "--optimizers", "dmuon",
                 "--backward-step", "on", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    entry = json.loads(out.read_text())["slowest_rank"]["dmuon"]
    # NOTE: one rank holds every matrix whole: each one's NS runs in its group's hook.
    assert entry["backward_step"] is True and entry["hidden"] == pytest.approx(1.0), entry
    assert "world 1: the NS begun from backward runs on this device inside backward" in text
