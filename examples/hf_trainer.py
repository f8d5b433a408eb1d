"""DMuon under the Hugging Face Trainer: a small random-init GPT-2 on byte-level text that
ships with Python (no downloads), with checkpoints and resume.

    pip install transformers accelerate
    python examples/hf_trainer.py --output-dir runs/hf_trainer --max-steps 200
    python examples/hf_trainer.py --output-dir runs/hf_trainer --max-steps 400 --resume

The optimizer is handed to the Trainer (``optimizers=(optimizer, None)``): DMuon routes the
model itself (GPT-2's Conv1D weights to Muon as the matrices they transpose, embeddings and
the tied head to AdamW), and the Trainer builds its lr scheduler around it, clips gradients,
saves and restores DMuon's state in its checkpoints, and resumes.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch.utils.data import Dataset

import dmuon
from dmuon.cli.train.data import VOCAB_SIZE, load_corpus


class ByteBlocks(Dataset):
    """Non-overlapping blocks of `seq` bytes; labels are the inputs (the model shifts them)."""

    def __init__(self, data: torch.Tensor, seq: int) -> None:
        self.blocks = data[: len(data) // seq * seq].view(-1, seq)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[idx], "labels": self.blocks[idx]}


def build_model(*, dim: int, layers: int, seq: int, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB_SIZE, n_positions=seq, n_embd=dim, n_layer=layers, n_head=max(1, dim // 16),
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def make_trainer(args: argparse.Namespace):
    """The Trainer with a fresh model and DMuon (the same seed gives the same model)."""
    from transformers import Trainer, TrainingArguments

    model = build_model(dim=args.dim, layers=args.layers, seq=args.seq, seed=args.seed)
    optimizer = dmuon.DMuon(model, lr=args.lr, weight_decay=0.1, adamw_lr=args.adamw_lr)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch,
        lr_scheduler_type="cosine", warmup_steps=max(1, args.max_steps // 10), logging_steps=max(1, args.max_steps // 10),
        save_steps=args.save_steps, save_strategy="steps", report_to=[], seed=args.seed, data_seed=args.seed,
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True)
    corpus = load_corpus()
    return Trainer(model=model, args=training, train_dataset=ByteBlocks(corpus.train, args.seq),
                   optimizers=(optimizer, None))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True, help="checkpoints and the Trainer's logs")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--save-steps", type=int, default=100, help="a checkpoint every N steps")
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output-dir")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.02, help="Muon's lr (adjust_lr match_rms_adamw)")
    parser.add_argument("--adamw-lr", type=float, default=3e-3, help="AdamW's lr (embeddings, norms, biases)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_steps < 1 or args.save_steps < 1:
        parser.error("--max-steps and --save-steps must be >= 1")
    return args


def main(argv: list[str] | None = None):
    """Train (or resume); returns the Trainer's TrainOutput and the trained model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    trainer = make_trainer(args)
    print(trainer.optimizer.routing_summary().line())  # NOTE: before train(), the DMuon itself
    output = trainer.train(resume_from_checkpoint=True if args.resume else None)
    print(f"steps {output.global_step}, mean training loss {output.training_loss:.4f} "
          f"(uniform over bytes: {math.log(VOCAB_SIZE):.4f})")
    return output, trainer.model


if __name__ == "__main__":
    main()
