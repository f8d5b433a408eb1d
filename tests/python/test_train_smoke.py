"""`python -m dmuon train`: a tiny end-to-end run, the byte data and entropy, and routing."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from dmuon.cli.train.config import TrainConfig
from dmuon.cli.train.data import eval_batches, load_corpus, load_text, sample_batch, unigram_entropy
from dmuon.cli.train.model import build_model
from dmuon.cli.train.optim import build_optimizer, lr_multiplier, muon_param_names

# Tiny settings: a few seconds on 2 CPU cores for both optimizers.
_TINY = [
    "--steps", "8", "--batch-size", "8", "--seq-len", "32", "--d-model", "32", "--layers", "1",
    "--heads", "2", "--warmup-steps", "2", "--eval-every", "4", "--eval-max-batches", "4",
    "--lr", "1e-2", "--adamw-lr", "1e-2", "--no-progress",
]


def _train(out, *args: str) -> dict:
    """`python -m dmuon train` with the tiny settings, then `args`, writing into `out`; its
    results.json results by optimizer."""
    from dmuon.cli.main import main

    assert main(["train", *_TINY, "--device", "cpu", "--no-plot", *args, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["results"]


# End to end through the real entry point: table, JSON, PNG, falling finite losses; in
# this process (world 1) and on 2 Gloo processes under FSDP2 and DDP.
@pytest.mark.parametrize("parallel", [["--world", "1"], ["--world", "2", "--parallel", "fsdp2"],
                                      ["--world", "2", "--parallel", "ddp"]], ids=["single", "fsdp2", "ddp"])
@pytest.mark.slow
def test_train_job_end_to_end(tmp_path, capsys, parallel):
    from dmuon.cli.main import main

    out = tmp_path / "run"
    assert main(["train", *_TINY, *parallel, "--device", "cpu", "--optimizers", "dmuon,adamw", "--out", str(out)]) == 0
    printed = capsys.readouterr().out

    # The table has a header, one row per optimizer and the entropy verdicts.
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("optimizer"))
    assert "val loss" in lines[header] and "tokens/s" in lines[header]
    assert lines[header + 2].split()[0] == "dmuon" and lines[header + 3].split()[0] == "adamw"
    assert "unigram (byte) entropy" in printed
    assert "dmuon: val loss" in printed and "adamw: val loss" in printed

    # JSON: every run has 8 finite training losses, a lower final loss than its first, and
    # val losses at steps 0, 4, 8 that fall from the untrained model's.
    record = json.loads((out / "results.json").read_text())
    assert record["unigram_entropy_nats"] == pytest.approx(unigram_entropy(load_corpus().train))
    assert set(record["results"]) == {"dmuon", "adamw"}
    for name, result in record["results"].items():
        losses = result["train_losses"]
        assert len(losses) == 8 and all(math.isfinite(x) for x in losses), name
        assert losses[-1] < losses[0], (name, losses)
        assert result["val_steps"] == [0, 4, 8]
        assert result["final_val_loss"] < result["val_losses"][0], (name, result["val_losses"])
        assert result["tokens_per_s"] > 0 and result["step_time_median_ms"] > 0
    # NOTE: same init and data order, so both runs start from the same loss.
    first = [r["train_losses"][0] for r in record["results"].values()]
    assert first[0] == pytest.approx(first[1], abs=1e-6)

    # The PNG is a real PNG.
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Data parallelism changes the cost, not the math: 2 ranks (FSDP2) train like 1 rank.
@pytest.mark.slow
def test_two_ranks_train_like_one(tmp_path):
    losses = {world: _train(tmp_path / world, "--world", world, "--optimizers", "dmuon")["dmuon"]["train_losses"]
              for world in ("1", "2")}
    # NOTE: the ranks' forward passes see half batches, so sums are ordered differently:
    # float32 rounding differences, amplified over 8 steps, stay far below 1e-4.
    assert losses["1"] == pytest.approx(losses["2"], rel=1e-4)


def _checkpoint(out, optimizer: str) -> dict:
    """The whole checkpoint a run saved for `optimizer` (every tensor whole)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = out / f"{optimizer}.pt"
    dcp_to_torch_save(out / "checkpoints" / optimizer, whole)
    return torch.load(whole, weights_only=False)


def _assert_bitwise_equal(a, b, where: str = "") -> None:
    """Nested dicts and lists of tensors and plain values: the same keys and the same bits."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_bitwise_equal(a[key], b[key], f"{where}.{key}")
    elif torch.is_tensor(a):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


# Checkpoint and resume: a 3-step run checkpointed and resumed to 6 steps is the 6-step run,
# bit for bit (every loss and lr, and the last checkpoint: weights, optimizer and scheduler
# state, data generator), in one process and on 2 Gloo ranks under FSDP2.
@pytest.mark.parametrize("parallel", [["--world", "1"], ["--world", "2", "--parallel", "fsdp2"]], ids=["single", "fsdp2"])
def test_resumed_run_is_the_uninterrupted_run_bitwise(tmp_path, parallel):
    # NOTE: a warm-up longer than the run keeps the lr schedule independent of --steps, and
    # eval every 3 steps puts the 3-step run's last evaluation where the 6-step run has one.
    args = [*parallel, "--optimizers", "dmuon,adamw", "--warmup-steps", "8", "--eval-every", "3",
            "--checkpoint-every", "3"]
    whole = _train(tmp_path / "whole", *args, "--steps", "6")
    _train(tmp_path / "resumed", *args, "--steps", "3")
    resumed = _train(tmp_path / "resumed", *args, "--steps", "6", "--resume")
    for name in ("dmuon", "adamw"):
        for key in ("train_losses", "lrs", "val_steps", "val_losses"):
            assert resumed[name][key] == whole[name][key], (name, key)
        assert len(whole[name]["train_losses"]) == 6 and whole[name]["val_steps"] == [0, 3, 6]
        saved = _checkpoint(tmp_path / "whole", name)
        assert saved["progress"]["step"] == 6 and saved["scheduler"]["last_epoch"] == 6
        _assert_bitwise_equal(_checkpoint(tmp_path / "resumed", name), saved, name)


# --resume without a checkpoint names the path; a torn checkpoint is refused by name.
def test_resume_refuses_a_missing_or_torn_checkpoint(tmp_path):
    from dmuon.checkpoint import MARKER, CheckpointError

    args = ["--world", "1", "--optimizers", "adamw", "--steps", "2", "--checkpoint-every", "1"]
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "checkpoints" / "adamw"))):
        _train(tmp_path, *args, "--resume")
    _train(tmp_path, *args)
    (tmp_path / "checkpoints" / "adamw" / MARKER).unlink()
    with pytest.raises(CheckpointError, match=f"no {MARKER}"):
        _train(tmp_path, *args, "--steps", "3", "--resume")


# Entropy of known byte strings, in nats.
def test_unigram_entropy_known_values():
    as_tensor = lambda raw: torch.tensor(list(raw), dtype=torch.long)  # noqa: E731
    assert unigram_entropy(as_tensor(b"aaaa")) == 0.0
    assert unigram_entropy(as_tensor(b"abab")) == pytest.approx(math.log(2))
    assert unigram_entropy(as_tensor(b"abcd" * 3)) == pytest.approx(math.log(4))
    # p = (1/2, 1/4, 1/4): H = 1.5 bits.
    assert unigram_entropy(as_tensor(b"aabc")) == pytest.approx(1.5 * math.log(2))
    with pytest.raises(ValueError, match="data"):
        unigram_entropy(torch.empty(0, dtype=torch.long))


# The corpus is the UTF-8 bytes of the sorted topics, split 90/10, and windows line up.
def test_corpus_bytes_split_and_windows():
    from pydoc_data.topics import topics

    corpus = load_corpus(val_fraction=0.1)
    raw = "".join(topics[k] for k in sorted(topics)).encode("utf-8")
    assert load_text().encode("utf-8") == raw
    assert bytes(torch.cat([corpus.train, corpus.val]).tolist()) == raw
    assert len(corpus.val) == len(raw) - int(len(raw) * 0.9)
    assert 2.5 < unigram_entropy(corpus.train) < math.log(256)

    # Training windows: targets are inputs shifted by one byte; same seed, same batches.
    draw = lambda: sample_batch(  # noqa: E731
        corpus.train, batch_size=4, seq_len=16, generator=torch.Generator().manual_seed(3)
    )
    (x1, y1), (x2, y2) = draw(), draw()
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])

    # Eval windows tile the val split in order.
    batches = eval_batches(corpus.val, batch_size=5, seq_len=16)
    inputs = torch.cat([x for x, _ in batches]).flatten()
    targets = torch.cat([y for _, y in batches]).flatten()
    assert torch.equal(inputs, corpus.val[: len(inputs)])
    assert torch.equal(targets, corpus.val[1 : len(inputs) + 1])


# dmuon.DMuon routes the model's hidden Linears to Muon and lm_head/embeddings/norms to AdamW.
def test_dmuon_routes_head_and_embeddings_to_adamw():
    config = TrainConfig(d_model=32, num_layers=2, num_heads=2, seq_len=16)
    model = build_model(config)
    names = {id(p): n for n, p in model.named_parameters()}
    expected_muon = {
        f"blocks.{i}.{proj}.weight"
        for i in range(2)
        for proj in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.up_proj", "mlp.down_proj")
    }
    assert set(muon_param_names(model)) == expected_muon

    optimizer = build_optimizer("dmuon", model, config)
    routed = {True: set(), False: set()}
    for group in optimizer.param_groups:
        routed[bool(group["use_muon"])].update(names[id(p)] for p in group["params"])
    assert routed[True] == expected_muon
    assert {"lm_head.weight", "tok_emb.weight", "pos_emb.weight", "final_norm.weight"} <= routed[False]
    assert routed[True] | routed[False] == set(names.values())


# Schedule and config checks.
def test_lr_schedule_and_config_errors():
    kwargs = dict(total_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_multiplier(0, **kwargs) == pytest.approx(0.1)
    assert lr_multiplier(9, **kwargs) == pytest.approx(1.0)
    assert lr_multiplier(10, **kwargs) == pytest.approx(1.0)
    assert lr_multiplier(100, **kwargs) == pytest.approx(0.1)
    assert 0.1 < lr_multiplier(55, **kwargs) < 1.0
    with pytest.raises(ValueError, match="optimizers"):
        TrainConfig(optimizers=("sgd",))
    with pytest.raises(ValueError, match="d_model"):
        TrainConfig(d_model=30, num_heads=4)
    with pytest.raises(TypeError):
        TrainConfig(64)  # keyword-only
