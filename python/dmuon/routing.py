"""Which parameters Muon orthogonalizes and how each one is viewed as matrices.

Rules for a module (`route_module`):
- Muon: weights of ``nn.Linear``, of convolutions (``nn.Conv1d/2d/3d``, flattened to
  ``[out_channels, in_channels·kernel]``), and 3-D parameters of other modules, which are
  stacks of independent matrices such as MoE experts ``[E, m, n]``.
- AdamW: embeddings, the output head (a Linear whose weight is tied to an embedding, whose
  name is ``lm_head``, ``output``, ``head``, ``classifier`` or ``score``, or whose
  ``out_features`` equals an embedding's vocabulary size), norms, biases, scalars and any
  other parameter with fewer than two dimensions.

Rules for a plain iterable of parameters: ``ndim ≥ 2`` → Muon (2-D: one matrix; 3-D: a
stack of matrices; ≥ 4-D: a convolution flattened after dim 0).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import torch
from torch import nn

_HEAD_NAMES = frozenset({"lm_head", "output", "head", "classifier", "score"})
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutedParam:
    """One parameter with its routing decision."""

    name: str
    param: nn.Parameter
    use_muon: bool
    batch_dims: int  # 1: [E, m, n] stack of matrices; 0: one matrix (trailing dims flattened)
    reason: str


def default_batch_dims(param: torch.Tensor) -> int:
    """Matrix view of a bare parameter: 3-D is a stack of matrices, else one matrix."""
    return 1 if param.dim() == 3 else 0


def route_module(module: nn.Module, muon_filter: Callable[[str, nn.Parameter], bool] | None = None) -> list[RoutedParam]:
    """Route every trainable parameter of `module` (shared parameters once)."""
    embeddings = [m for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    embedding_weights = {id(m.weight) for m in embeddings}
    vocab_sizes = {m.num_embeddings for m in embeddings}
    owner: dict[int, tuple[str, nn.Module]] = {}
    for module_name, sub in module.named_modules():
        for param_name, param in sub.named_parameters(recurse=False):
            owner.setdefault(id(param), (module_name, sub))

    routed: list[RoutedParam] = []
    for name, param in module.named_parameters():  # NOTE: yields each shared parameter once
        if not param.requires_grad:
            continue
        module_name, sub = owner[id(param)]
        leaf = module_name.rsplit(".", 1)[-1]
        use_muon, batch_dims, reason = False, 0, ""
        if param.dim() < 2:
            reason = "fewer than 2 dims (bias, norm, scalar)"
        elif id(param) in embedding_weights:
            reason = "embedding"
        elif isinstance(sub, nn.Linear) and name.endswith("weight"):
            if leaf in _HEAD_NAMES:
                reason = f"output head (module named {leaf!r})"
            elif sub.out_features in vocab_sizes and sub.out_features > sub.in_features:
                reason = "output head (out_features equals an embedding's vocabulary)"
            else:
                use_muon, reason = True, "Linear weight"
        elif isinstance(sub, _CONV_TYPES) and name.endswith("weight"):
            use_muon, reason = True, "convolution weight (flattened)"
        elif param.dim() == 3:
            use_muon, batch_dims, reason = True, 1, "3-D stack of matrices"
        else:
            reason = f"{param.dim()}-D parameter of {type(sub).__name__}"
        if muon_filter is not None:
            chosen = bool(muon_filter(name, param))
            if chosen != use_muon:
                reason = "muon_filter"
                if chosen and param.dim() < 2:
                    raise ValueError(f"muon_filter selected parameter {name!r} of shape {tuple(param.shape)} for Muon, which needs at least 2 dims")
                batch_dims = default_batch_dims(param) if chosen and not isinstance(sub, _CONV_TYPES) else 0
            use_muon = chosen
        routed.append(RoutedParam(name=name, param=param, use_muon=use_muon, batch_dims=batch_dims, reason=reason))
    return routed


def route_params(params: Iterable[torch.Tensor | tuple[str, torch.Tensor]], prefix: str) -> list[RoutedParam]:
    """Route a plain iterable (optionally of (name, param) pairs) by ndim."""
    routed = []
    for idx, item in enumerate(params):
        name, param = item if isinstance(item, tuple) else (f"{prefix}[{idx}]", item)
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"parameter {name!r} is a {type(param).__name__}, not a tensor")
        use_muon = param.dim() >= 2
        routed.append(RoutedParam(name=name, param=param, use_muon=use_muon,
                                  batch_dims=default_batch_dims(param) if use_muon else 0,
                                  reason="ndim >= 2" if use_muon else "ndim < 2"))
    return routed
