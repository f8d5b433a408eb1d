"""A small GPT-style decoder over bytes.

Parameter names are part of the contract with dmuon.DMuon's auto-routing: every nn.Linear
weight goes to Muon except `lm_head`; the embeddings (`tok_emb`, `pos_emb`) and the
LayerNorms go to AdamW. Linears have no biases.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dmuon.cli.train.config import TrainConfig
from dmuon.cli.train.data import VOCAB_SIZE


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q/k/v/o projections."""

    def __init__(self, *, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        # NOTE: separate q/k/v (not fused) so Muon orthogonalizes each projection on its own.
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape  # x: [B, T, C]
        head_dim = d_model // self.num_heads

        # Project and split heads: [B, H, T, C/H].
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, self.num_heads, head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, C/H]
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, d_model))


class MLP(nn.Module):
    """Two-layer GELU MLP."""

    def __init__(self, *, d_model: int, hidden: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, *, d_model: int, num_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model=d_model, num_heads=num_heads)
        self.mlp_norm = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model=d_model, hidden=mlp_ratio * d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Token + learned position embeddings, pre-LN blocks, final LayerNorm, untied lm_head."""

    def __init__(
        self, *, vocab_size: int, max_seq_len: int, d_model: int, num_layers: int,
        num_heads: int, mlp_ratio: int,
    ) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model=d_model, num_heads=num_heads, mlp_ratio=mlp_ratio)
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self._init_weights(num_layers)

    def _init_weights(self, num_layers: int) -> None:
        # GPT-2 init: N(0, 0.02); residual output projections scaled by 1/sqrt(2 * layers).
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for block in self.blocks:
            for proj in (block.attn.o_proj, block.mlp.down_proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * num_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] for byte tokens [B, T]."""
        seq = tokens.shape[1]
        if seq > self.max_seq_len:
            raise ValueError(f"tokens: sequence length {seq} exceeds max_seq_len {self.max_seq_len}")
        positions = torch.arange(seq, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))


def build_model(config: TrainConfig) -> GPT:
    """The GPT of `config`, initialized from `config.seed` (same weights for every optimizer)."""
    # NOTE: a private generator scope keeps the init independent of earlier RNG use.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = GPT(
            vocab_size=VOCAB_SIZE,
            max_seq_len=config.seq_len,
            d_model=config.d_model,
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
        )
    return model.to(config.resolved_device())


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy in nats."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
