"""A tiny Llama-shaped language model for the framework tests (torchtitan's FQNs:
tok_embeddings, layers.N.attention.wq…, norm, output), no downloads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HIDDEN = 64, 16, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.wq, self.wo = nn.Linear(DIM, DIM, bias=False), nn.Linear(DIM, DIM, bias=False)
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        x = x + self.wo(torch.tanh(self.wq(h)))  # NOTE: a token-wise mixer stands in for attention
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLM(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(layers)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            x = layer(x)
        return self.output(self.norm(x))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())


def batch(step: int, rank: int = 0, size: int = 4, seq: int = 9) -> torch.Tensor:
    return torch.randint(0, VOCAB, (size, seq), generator=torch.Generator().manual_seed(1000 * step + rank))
