"""Small local models (no downloads, no transformers) shaped like the architectures the
torch.optim contract tests route: a decoder LM, a ViT, classifiers, GPT-2's Conv1D, MoE."""

from __future__ import annotations

import torch
from torch import nn


class TinyDecoder(nn.Module):
    """Embedding, one attention-and-MLP block, a final norm and an untied lm_head."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.up_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.down_proj = nn.Linear(3 * dim, dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        x = x + self.o_proj(torch.tanh(self.q_proj(x)))
        x = x + self.down_proj(torch.relu(self.up_proj(x)))
        return self.lm_head(self.norm(x))


class Conv1D(nn.Module):
    """The layer of transformers.pytorch_utils.Conv1D (GPT-2): y = x·W + b with W (in, out)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)


class TinyGPT2(nn.Module):
    """GPT-2's layout: wte, wpe, Conv1D attention and MLP, lm_head tied to wte."""

    def __init__(self, vocab: int = 64, dim: int = 12, positions: int = 16) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(positions, dim)
        self.c_attn = Conv1D(3 * dim, dim)
        self.c_fc = Conv1D(4 * dim, dim)
        self.c_proj = Conv1D(dim, 4 * dim)
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[-1]))
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        x = x + torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        x = x + self.c_proj(torch.relu(self.c_fc(x)))
        return self.lm_head(self.ln_f(x))


class TinyViT(nn.Module):
    """Patch embedding, class token, positional embedding, an MHA block and a head."""

    def __init__(self, dim: int = 32, patches: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, dim) * 0.02)
        self.attn = nn.MultiheadAttention(dim, num_heads=4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = x + self.attn(x, x, x, need_weights=False)[0]
        x = x + self.mlp(x)
        return self.head(self.norm(x[:, 0]))


class ResNetLike(nn.Module):
    """torchvision's naming: convolutions, then a top-level `fc` classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return self.fc(x.mean(dim=(2, 3)))


class MoEExperts(nn.Module):
    """Experts as one 3-D parameter per projection (as HF's MoE experts modules)."""

    def __init__(self, experts: int = 4, dim: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * hidden, dim) * 0.1)
        self.down = nn.Parameter(torch.randn(experts, dim, hidden) * 0.1)


class RelativeBias(nn.Module):
    """A 3-D table of another kind: not an expert stack."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = nn.Parameter(torch.randn(4, 7, 7) * 0.1)


class MoEModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4, bias=False)
        self.moe = MoEExperts()
        self.bias = RelativeBias()


def mlp_classifier() -> nn.Sequential:
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
