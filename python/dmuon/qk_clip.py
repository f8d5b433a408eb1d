"""QK-clip of MuonClip (Kimi Team, 2025, "Kimi K2: Open Agentic Intelligence"): after an
applied optimizer step, every attention head whose largest pre-softmax logit in that step
exceeded ``tau`` has its query (and key) rows scaled down so that its logits shrink by
γ_h = tau / max_logit_h. The factors (multi-head: √γ_h on W_q's and W_k's rows of the head;
GQA: γ_h on W_q's rows, the shared W_k untouched) come from the C++ core
(csrc/optim/qk_clip.h, which documents the rule); this module keeps the per-head maxima the
model records during the step and scales the rows each rank holds.

Usage::

    clip = dmuon.QKClip(tau=100.0, layers={"layer0": dmuon.QKLayer(q=attn.q_proj.weight,
                        k=attn.k_proj.weight, num_heads=8, num_kv_heads=2, head_dim=64)})
    opt = dmuon.DMuon(model, lr=0.02, qk_clip=clip)
    # in the attention forward (post-RoPE q [B, H, T, d], k [B, K, T, d]):
    clip.record("layer0", dmuon.qk_clip.max_logits_per_head(q, k))

Distributed: the maxima are agreed (max) over ``process_group`` (default: the default
group when one is initialized) before use, so ranks that saw other batches (data parallel)
or other heads (tensor parallel: record ``-inf`` for heads not computed here) agree. With
the default group, DMuon carries them in its step's result agreement (``local_keys``: the
float32 maxima as integers that order like them); a clip given its own process_group
all-reduces them itself, the one collective of its own inside ``DMuon.step``. A
weight that is a DTensor sharded on dim 0 (FSDP2, TP column-wise, FSDP2 over TP) is scaled
on each rank over the rows it holds; every rank computes the same factors.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from dmuon._ops import _C


@dataclasses.dataclass(frozen=True, kw_only=True)
class QKLayer:
    """One attention layer: its query and key projection weights ([num_heads·head_dim, hidden]
    and [num_kv_heads·head_dim, hidden], rows grouped by head) and its head counts."""

    q: torch.Tensor
    k: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def check(self, name: str) -> None:
        for field in ("num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"QKLayer {name!r}: {field} must be an integer >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"QKLayer {name!r}: num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")
        for field, heads in (("q", self.num_heads), ("k", self.num_kv_heads)):
            w = getattr(self, field)
            if not isinstance(w, torch.Tensor) or w.dim() < 1 or w.shape[0] != heads * self.head_dim:
                shape = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise ValueError(f"QKLayer {name!r}: {field} must have {heads}·{self.head_dim} = "
                                 f"{heads * self.head_dim} rows (heads × head_dim), got {shape}")


def max_logits_per_head(q: torch.Tensor, k: torch.Tensor, scale: float | None = None,
                        causal: bool = True) -> torch.Tensor:
    """The largest pre-softmax logit of every q head: q [B, H, T, d], k [B, K, T, d] (GQA:
    q head h reads k head h // (H / K)), logits (q·kᵀ)·scale (default 1/√d), causal mask
    optional. Returns float32 [H]. NOTE: it materializes [B, H, T, T] (no gradient): for
    tests and small models; fused attention kernels that return their row maxima should
    record those instead."""
    with torch.no_grad():
        b, h, t, d = q.shape
        kv = k.shape[1]
        if h % kv:
            raise ValueError(f"max_logits_per_head: {kv} kv heads do not divide {h} q heads")
        k = k.repeat_interleave(h // kv, dim=1)
        logits = (q.float() @ k.float().transpose(-1, -2)) * (1.0 / math.sqrt(d) if scale is None else scale)
        if causal:
            mask = torch.ones(t, k.shape[2], dtype=torch.bool, device=q.device).triu(1)
            logits = logits.masked_fill(mask, float("-inf"))
        return logits.amax(dim=(0, 2, 3))


class QKClip:
    """MuonClip's QK-clip (see the module docstring). ``tau``: the logit threshold (> 0);
    ``layers``: name → QKLayer."""

    def __init__(self, *, tau: float, layers: Mapping[str, QKLayer], process_group: Any = None) -> None:
        if not (isinstance(tau, (int, float)) and not isinstance(tau, bool) and math.isfinite(tau) and tau > 0):
            raise ValueError(f"QKClip: tau must be a finite number > 0, got {tau!r}")
        if not layers:
            raise ValueError("QKClip: layers must name at least one attention layer")
        for name, layer in layers.items():
            if not isinstance(layer, QKLayer):
                raise ValueError(f"QKClip: layer {name!r} must be a dmuon.QKLayer, got {type(layer).__name__}")
            layer.check(name)
        self.tau = float(tau)
        self.layers = dict(layers)
        self.process_group = process_group
        self._max: dict[str, torch.Tensor] = {}
        self.last_max_logits: dict[str, list[float]] = {}  # what the last apply() used

    def record(self, layer: str, max_logits: torch.Tensor) -> None:
        """Folds this forward's per-q-head max logits ([num_heads]) of `layer` into the
        step's running max (no host sync)."""
        if layer not in self.layers:
            raise KeyError(f"QKClip.record: unknown layer {layer!r}; layers are {sorted(self.layers)}")
        heads = self.layers[layer].num_heads
        values = max_logits.detach().reshape(-1).float()
        if values.numel() != heads:
            raise ValueError(f"QKClip.record({layer!r}): {values.numel()} max logits for {heads} heads")
        seen = self._max.get(layer)
        self._max[layer] = values.clone() if seen is None else torch.maximum(seen, values.to(seen.device))

    def attach(self, module: nn.Module, layer: str, q_proj: str = "q_proj", k_proj: str = "k_proj") -> list[Any]:
        """Hooks that record `layer`'s max logits from the outputs of `module`'s q and k
        projections ([B, T, heads·head_dim], causal). NOTE: the logits are those of the
        projections as they come out: right for attention without rotary embeddings; a
        model with RoPE calls record() from its attention with the rotated q and k."""
        spec = self.layers[layer]
        outputs: dict[str, torch.Tensor] = {}

        def keep(which: str):
            def hook(_m: nn.Module, _args: Any, out: torch.Tensor) -> None:
                outputs[which] = out.detach()
            return hook

        def done(_m: nn.Module, _args: Any, _out: Any) -> None:
            if "q" in outputs and "k" in outputs:
                q, k = outputs.pop("q"), outputs.pop("k")
                b, t = q.shape[0], q.shape[1]
                q = q.reshape(b, t, spec.num_heads, spec.head_dim).transpose(1, 2)
                k = k.reshape(b, t, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
                self.record(layer, max_logits_per_head(q, k))

        return [getattr(module, q_proj).register_forward_hook(keep("q")),
                getattr(module, k_proj).register_forward_hook(keep("k")),
                module.register_forward_hook(done)]

    def reset(self) -> None:
        """Forgets the step's maxima (a skipped step)."""
        self._max.clear()

    def _group(self) -> Any:
        if self.process_group is not None:
            return self.process_group
        return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None

    def _stacked(self) -> torch.Tensor:
        """Every layer's maxima (layers by name), float32, on the weights' device."""
        device = next(iter(self.layers.values())).q.device
        return torch.cat([self._max.get(n, torch.full((self.layers[n].num_heads,), float("-inf"))).to(device)
                          for n in sorted(self.layers)])

    def agrees_with(self, world_size: int) -> bool:
        """Whether a step's result agreement over `world_size` ranks agrees the maxima over
        this clip's group: the default group, spanning those ranks."""
        if self.process_group is not None:
            return False
        group = self._group()
        return (1 if group is None else dist.get_world_size(group)) == world_size

    def local_keys(self) -> list[int]:
        """This rank's maxima as integers that order like them (the result agreement's max).
        NOTE: a float32's bits as int32 order like it for non-negative values and reversed for
        negative ones; flipping a negative's other 31 bits makes the order total."""
        bits = self._stacked().float().cpu().view(torch.int32).to(torch.int64)
        return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).tolist()

    @staticmethod
    def _from_keys(keys: list[int]) -> torch.Tensor:
        bits = torch.tensor(keys, dtype=torch.int64)
        bits = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        return bits.to(torch.int32).view(torch.float32)

    @torch.no_grad()
    def apply(self, agreed_keys: list[int] | None = None) -> dict[str, tuple[list[float], list[float]]]:
        """After an applied step: every layer's factors (q per head, k per kv head) from the
        maxima agreed over the group, applied to the rows this rank holds; then reset.
        `agreed_keys`: the maxima as agreed already (local_keys' form, max over the ranks);
        None: all-reduced here over the group, collective when distributed (every rank calls
        it, with the same layers)."""
        names = sorted(self.layers)
        if agreed_keys is not None:
            stacked = self._from_keys(agreed_keys)
        else:
            stacked = self._stacked()
            group = self._group()
            if group is not None:
                # NOTE: Gloo and NCCL both reduce MAX; -inf (no record on a rank) never wins.
                backend_device = torch.device("cpu") if dist.get_backend(group) == "gloo" else stacked.device
                moved = stacked.to(backend_device)
                dist.all_reduce(moved, op=dist.ReduceOp.MAX, group=group)
                stacked = moved
        values = stacked.double().tolist()
        out: dict[str, tuple[list[float], list[float]]] = {}
        at = 0
        for name in names:
            spec = self.layers[name]
            maxima = values[at:at + spec.num_heads]
            at += spec.num_heads
            self.last_max_logits[name] = maxima
            q_f, k_f = _C.qk_clip_factors(maxima, spec.num_kv_heads, self.tau)
            out[name] = (q_f, k_f)
            _scale_head_rows(spec.q, q_f, spec.head_dim, f"{name}.q")
            _scale_head_rows(spec.k, k_f, spec.head_dim, f"{name}.k")
        self.reset()
        return out


def _local_row_runs(w: torch.Tensor, what: str) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The local tensor of `w` and the global rows it holds, as (first row, count) runs in
    local order. NOTE: FSDP2 over TP places rows with ``_StridedShard`` (the TP chunk split
    again over the data-parallel ranks), so the rows are found by distributing the row
    indices as `w` is placed (each rank from its own copy: no communication)."""
    if not isinstance(w, DTensor):
        return w, [(0, w.shape[0])]
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    for placement in w.placements:
        if not (placement.is_replicate() or (isinstance(placement, (Shard, _StridedShard)) and placement.dim == 0)):
            raise ValueError(f"QKClip: {what} is placed {tuple(w.placements)}; QK-clip scales rows of weights that "
                             "are replicated or sharded on dim 0 (FSDP2, tensor-parallel column-wise, both)")
    local = w.to_local()
    ids = distribute_tensor(torch.arange(w.shape[0], dtype=torch.int64, device=local.device), w.device_mesh,
                            list(w.placements), src_data_rank=None).to_local().tolist()
    runs: list[tuple[int, int]] = []
    for row in ids:
        if runs and runs[-1][0] + runs[-1][1] == row:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((row, 1))
    return local, runs


def _scale_head_rows(w: torch.Tensor, head_factors: list[float], head_dim: int, what: str) -> None:
    """Rows of `w` this rank holds × their head's factor (in float32 for 16-bit weights)."""
    if all(f == 1.0 for f in head_factors):
        return
    local, runs = _local_row_runs(w, what)
    if local.shape[0] == 0:
        return
    factors = [f for begin, count in runs for f in _C.qk_clip_row_factors(head_factors, head_dim, begin, count)]
    f = torch.tensor(factors, dtype=torch.float32 if local.dtype != torch.float64 else torch.float64,
                     device=local.device).reshape(-1, *([1] * (local.dim() - 1)))
    if local.dtype in (torch.float32, torch.float64):
        local.mul_(f)
    else:
        local.copy_((local.float() * f).to(local.dtype))
