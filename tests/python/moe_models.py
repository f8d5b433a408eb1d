"""Small MoE blocks for the routing tests: one with HF transformers' fused expert stack
(gate_up_proj [E, 2I, H] beside down_proj [E, H, I]) and one holding the same experts as
separate gate and up stacks (torchtitan's w1 and w3), with the same values."""

from __future__ import annotations

import torch
from torch import nn

EXPERTS, HIDDEN, INNER = 4, 12, 10


class FusedExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(EXPERTS, 2 * INNER, HIDDEN) / HIDDEN ** 0.5)
        self.down_proj = nn.Parameter(torch.randn(EXPERTS, HIDDEN, INNER) / INNER ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.einsum("bh,eih->bei", x, self.gate_up_proj).chunk(2, dim=-1)
        return torch.einsum("bei,ehi->bh", nn.functional.silu(gate) * up, self.down_proj)


class SplitExperts(nn.Module):
    def __init__(self, fused: FusedExperts) -> None:
        super().__init__()
        gate, up = fused.gate_up_proj.detach().chunk(2, dim=1)
        self.gate_proj = nn.Parameter(gate.clone())
        self.up_proj = nn.Parameter(up.clone())
        self.down_proj = nn.Parameter(fused.down_proj.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.einsum("bh,eih->bei", x, self.gate_proj)
        up = torch.einsum("bh,eih->bei", x, self.up_proj)
        return torch.einsum("bei,ehi->bh", nn.functional.silu(gate) * up, self.down_proj)


class MoEBlock(nn.Module):
    """Qwen2-MoE's shape of block: a router, experts, a shared expert and its 1×H gate."""

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        # NOTE: a model with an embedding has its head by name or vocabulary, not as its last Linear.
        self.embed_tokens = nn.Embedding(8, HIDDEN)
        self.experts = experts
        self.shared_expert = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.shared_expert_gate = nn.Linear(HIDDEN, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x) + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


def pair(seed: int = 0) -> tuple[MoEBlock, MoEBlock]:
    """The fused block and the split block with the same values."""
    torch.manual_seed(seed)
    fused = MoEBlock(FusedExperts())
    split = MoEBlock(SplitExperts(fused.experts))
    split.embed_tokens.load_state_dict(fused.embed_tokens.state_dict())
    split.shared_expert.load_state_dict(fused.shared_expert.state_dict())
    split.shared_expert_gate.load_state_dict(fused.shared_expert_gate.state_dict())
    return fused, split


def train_pair(fused: MoEBlock, split: MoEBlock, steps: int, make_optimizer, inputs) -> None:
    """`steps` steps of both blocks, each on its own optimizer, on the same inputs; the split
    block's gradients are the fused block's (so the two see the same gradients bit for bit)."""
    opt_fused, opt_split = make_optimizer(fused), make_optimizer(split)
    for step in range(steps):
        x = inputs(step)
        fused(x).square().mean().backward()
        with torch.no_grad():
            gate, up = fused.experts.gate_up_proj.grad.chunk(2, dim=1)
            split.experts.gate_proj.grad = gate.clone()
            split.experts.up_proj.grad = up.clone()
            for a, b in ((fused.experts.down_proj, split.experts.down_proj),
                         (fused.shared_expert.weight, split.shared_expert.weight),
                         (fused.shared_expert_gate.weight, split.shared_expert_gate.weight)):
                b.grad = a.grad.clone()
        opt_fused.step()
        opt_split.step()
        opt_fused.zero_grad()
        opt_split.zero_grad()
