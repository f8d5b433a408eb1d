"""Byte-level corpus: Python's shipped reference text (pydoc_data.topics), no download."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Byte-level tokenization: every byte is a token.
VOCAB_SIZE = 256


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """Train/val split of the byte stream, as int64 token tensors on the CPU."""

    train: torch.Tensor  # [num_train_bytes] int64
    val: torch.Tensor  # [num_val_bytes] int64


def load_text() -> str:
    """The reference text: every value of pydoc_data.topics, concatenated in sorted-key order."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


def load_corpus(*, val_fraction: float = 0.1) -> Corpus:
    """Tokenize the text at byte level and hold out its last `val_fraction` for validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    data = torch.frombuffer(bytearray(load_text().encode("utf-8")), dtype=torch.uint8).long()
    num_train = int(len(data) * (1.0 - val_fraction))
    return Corpus(train=data[:num_train], val=data[num_train:])


def unigram_entropy(data: torch.Tensor) -> float:
    """Entropy in nats of the byte histogram of `data`: the loss of the best context-free model."""
    if data.numel() == 0:
        raise ValueError("data must hold at least one byte")
    counts = torch.bincount(data.flatten().long(), minlength=VOCAB_SIZE).double()
    probs = counts[counts > 0] / counts.sum()
    # NOTE: max(0, .) turns the -0.0 of a single-symbol histogram into 0.0.
    return max(0.0, float(-(probs * probs.log()).sum()))


def sample_batch(
    data: torch.Tensor, *, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of `data` (inputs, next-byte targets), each [batch_size, seq_len]."""
    if len(data) <= seq_len:
        raise ValueError(f"seq_len ({seq_len}) must be shorter than the data ({len(data)} bytes)")
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # [batch_size, seq_len + 1]
    windows = data[offsets]
    return windows[:, :-1], windows[:, 1:]


def eval_batches(
    data: torch.Tensor, *, batch_size: int, seq_len: int, max_batches: int | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping windows covering `data` in order, grouped into batches (a fixed eval set)."""
    num_windows = (len(data) - 1) // seq_len
    if num_windows == 0:
        raise ValueError(f"seq_len ({seq_len}) must be shorter than the data ({len(data)} bytes)")
    inputs = data[: num_windows * seq_len].view(num_windows, seq_len)
    targets = data[1 : num_windows * seq_len + 1].view(num_windows, seq_len)
    batches = [
        (inputs[i : i + batch_size], targets[i : i + batch_size])
        for i in range(0, num_windows, batch_size)
    ]
    return batches if max_batches is None else batches[:max_batches]
