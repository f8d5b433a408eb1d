"""DMuon on a torchtitan-style parallelized model: a small Llama-style decoder with a
4-expert MoE in every block, on 4 CPU processes (Gloo), no downloads.

    python examples/torchtitan_style.py              # world 4: dp 2 × tp 2, experts ep 2 × dp 2
    python examples/torchtitan_style.py --steps 40

Parallelism, as torchtitan applies it:
- tensor parallel (``parallelize_module``): q, k, v, gate, up ColwiseParallel; o, down
  RowwiseParallel, over the "tp" dim of a (dp, tp) mesh;
- expert parallel: each block's expert stack [E, out, in] is a DTensor Shard(0) over the
  same "tp" ranks (they see the same tokens), every rank computing its own experts and the
  partial outputs summed over the group;
- ``fully_shard`` (FSDP2) over "dp" for every block, the embedding and the head: the TP
  weights become (_StridedShard/Shard, Shard) DTensors on the 2-D mesh, each expert whole
  on one rank.

DMuon takes the model as it is: every weight matrix, whatever its placements, is
orthogonalized once by one owner rank (experts where they already are), and the
embedding, the head and the norms go to AdamW.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dmuon
from dmuon.cli.launch import launch
from dmuon.cli.train.data import VOCAB_SIZE, load_corpus


class SumOverGroup(torch.autograd.Function):
    """Partial outputs summed over a group; the gradient passes through (every rank of the
    group computes the same loss, as under tensor parallelism)."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # NOTE: under TP each rank holds a slice of the heads (the local width / head_dim).
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MoE(nn.Module):
    """A dense-gated mixture of experts: Σ_e softmax(router(x))_e · down_e(silu(up_e(x)))."""

    def __init__(self, dim: int, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.up = nn.Parameter(torch.randn(num_experts, hidden, dim) / dim ** 0.5)
        self.down = nn.Parameter(torch.randn(num_experts, dim, hidden) / hidden ** 0.5)
        self.ep_group = None  # set by the expert-parallel split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.router(x).softmax(-1)  # [b, t, E]
        up, down = self.up, self.down
        first = 0
        if self.ep_group is not None:
            # This rank's experts: its Shard(0) slice of the stack (FSDP2 unsharded it over dp).
            up, down = up.to_local(), down.to_local()
            first = dist.get_rank(self.ep_group) * up.shape[0]
        h = F.silu(torch.einsum("btd,ehd->bteh", x, up))
        out = torch.einsum("bteh,edh,bte->btd", h, down, weights[..., first:first + up.shape[0]])
        return SumOverGroup.apply(out, self.ep_group) if self.ep_group is not None else out


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm, self.moe_norm = nn.RMSNorm(dim), nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.moe = MoE(dim, hidden, num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        h = self.mlp_norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x + self.moe(self.moe_norm(x))


class Llama(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4, hidden: int = 96, num_experts: int = 4) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB_SIZE, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden, num_experts) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, VOCAB_SIZE, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def parallelize(model: Llama, world: int):
    """TP over "tp", EP of the experts over the same ranks, FSDP2 over "dp" (torchtitan's
    order: TP, then EP, then fully_shard)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh["tp"], mesh["dp"]
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "gate": ColwiseParallel(), "up": ColwiseParallel(),
            "down": RowwiseParallel()}
    for block in model.layers:
        parallelize_module(block, tp, plan)
        moe = block.moe
        moe.up = nn.Parameter(distribute_tensor(moe.up.detach(), tp, [Shard(0)]))
        moe.down = nn.Parameter(distribute_tensor(moe.down.detach(), tp, [Shard(0)]))
        moe.ep_group = tp.get_group(0)
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    return mesh


def train(rank: int, world: int, steps: int, seq: int, batch: int, lr: float) -> dict:
    torch.manual_seed(0)
    model = Llama()
    mesh = parallelize(model, world)
    # ---- the three lines a torchtitan user changes: build DMuon instead of AdamW ----
    optimizer = dmuon.DMuon(model, lr=lr, weight_decay=0.0, adamw_lr=3 * lr)
    # ---------------------------------------------------------------------------------
    data = load_corpus().train
    dp_rank = mesh.get_coordinate()[0]
    gen = torch.Generator().manual_seed(1)
    losses, start = [], time.perf_counter()
    for step in range(steps):
        # NOTE: every rank draws the whole global batch; its dp slice is its share (tp ranks
        # see the same tokens).
        starts = torch.randint(0, len(data) - seq - 1, (batch * mesh.shape[0],), generator=gen)
        starts = starts[dp_rank * batch:(dp_rank + 1) * batch]
        x = torch.stack([data[s:s + seq] for s in starts])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        losses.append(float(reduced) / world)
        if rank == 0 and (step % 10 == 0 or step == steps - 1):
            print(f"step {step:3d}  loss {losses[-1]:.3f}", flush=True)
    return {"losses": losses, "seconds": time.perf_counter() - start,
            "orthogonalized": int(optimizer.runtime.last_stats.num_orthogonalized)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=4, help="processes (even): dp = world / 2, tp = 2")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="sequences per dp rank")
    parser.add_argument("--lr", type=float, default=0.02)
    args = parser.parse_args(argv)
    if args.world < 2 or args.world % 2:
        parser.error(f"--world must be even and at least 2, got {args.world}")
    results = launch(train, args.world, args.steps, args.seq, args.batch, args.lr, backend="gloo")
    first = results[0]
    print(f"loss {first['losses'][0]:.3f} -> {first['losses'][-1]:.3f} (uniform: {math.log(VOCAB_SIZE):.3f}) "
          f"in {first['seconds']:.1f} s; {sum(r['orthogonalized'] for r in results.values())} matrices "
          "orthogonalized per step over all ranks")
    return results


if __name__ == "__main__":
    main()
