"""dmuon.integrations.hf against the real transformers and accelerate (tests/requirements.txt):
DMuon as the optimizer the Trainer creates, with its TrainingArguments, trains (lr schedule,
clipping, accumulation), checkpoints and resumes to the uninterrupted model, and
routing_summary stays reachable through accelerate's wrapper after train()."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import dmuon  # noqa: E402
from dmuon.cli.train.data import VOCAB_SIZE, load_corpus  # noqa: E402
from dmuon.integrations import unwrap  # noqa: E402
from dmuon.integrations.hf import create_optimizer  # noqa: E402


class ByteBlocks(Dataset):
    """Blocks of `seq` bytes of the text corpus that ships with Python; labels are the inputs."""

    def __init__(self, seq: int) -> None:
        data = load_corpus().train[: 64 * seq]
        self.blocks = data[: len(data) // seq * seq].view(-1, seq)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[idx], "labels": self.blocks[idx]}


def make_trainer(output_dir, max_steps: int = 8):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB_SIZE, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    args = transformers.TrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        learning_rate=0.02, weight_decay=0.1, adam_beta1=0.8, max_grad_norm=0.5, lr_scheduler_type="cosine",
        warmup_steps=2, save_steps=4, save_strategy="steps", logging_steps=4, report_to=[], seed=0, data_seed=0,
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=ByteBlocks(32))
    create_optimizer(trainer, adamw_lr=3e-3)
    return trainer


def test_trainer_creates_dmuon_from_its_arguments_trains_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    trainer = make_trainer(tmp_path / "whole")
    output = trainer.train()
    assert output.global_step == 8 and output.training_loss < math.log(VOCAB_SIZE)
    optimizer = unwrap(trainer.optimizer)
    assert type(trainer.optimizer).__name__ == "AcceleratedOptimizer" and isinstance(optimizer, dmuon.DMuon)
    # The TrainingArguments' values, adamw_lr given.
    muon, adamw = optimizer.param_groups
    assert (muon["initial_lr"], adamw["initial_lr"], muon["weight_decay"], adamw["betas"]) == (0.02, 3e-3, 0.1,
                                                                                               (0.8, 0.999))
    # Reachable through accelerate's wrapper after train().
    summary = trainer.optimizer.routing_summary()
    assert "transformer.wte.weight" in str(summary) and summary.line() == optimizer.routing_summary().line()
    assert all(optimizer.matrix_view(p).transposed for p in muon["params"])  # GPT-2's Conv1D, routed by module

    # Interrupted after its step-4 checkpoint, then resumed.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-4", resumed_dir / "checkpoint-4")
    resumed = make_trainer(resumed_dir)
    assert resumed.train(resume_from_checkpoint=True).global_step == 8
    for (name, p), q in zip(trainer.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_create_optimizer_refuses_a_trainer_with_an_optimizer_and_builds_for_a_model(tmp_path):
    trainer = make_trainer(tmp_path)
    assert isinstance(trainer.create_optimizer(), dmuon.DMuon)  # the Trainer's own call, before train()
    with pytest.raises(ValueError, match="has an optimizer already"):
        create_optimizer(trainer)
    assert isinstance(create_optimizer(trainer.model, lr=0.01), dmuon.DMuon)
    with pytest.raises(TypeError, match="takes a transformers.Trainer or an nn.Module, got str"):
        create_optimizer("model")
