"""Which parameters Muon orthogonalizes and how each one is viewed as matrices.

Rules for a module (`route_module`), by the module that registers each parameter:
- Muon: weights of ``nn.Linear``; HF ``Conv1D`` weights (stored ``(in, out)``: a transposed
  matrix); ``nn.MultiheadAttention``'s ``in_proj_weight`` (its q, k and v row blocks are
  orthogonalized as three matrices) and ``q/k/v_proj_weight``; convolution weights
  (flattened to ``[out_channels, in_channels·kernel]``); 3-D parameters recognised as expert
  stacks ``[E, m, n]`` (a module whose class name says Expert/MoE, or a name with "expert"); a
  fused expert stack ``gate_up_proj [E, 2I, H]`` beside a ``down_proj [E, H, I]`` (HF
  transformers' MoE experts) is orthogonalized per expert as two matrices, gate (rows
  ``[0, I)``) and up (``[I, 2I)``), as dense models' gate_proj and up_proj are (torchtitan holds
  them as two stacks w1 and w3, and Moonlight's experts as two Linear layers); the
  ``[E, H, 2I]`` layout (gpt-oss, Llama 4, Aria: stored (in, out), gpt-oss's interleaved)
  stays one matrix per expert; an MoE router's ``[E, H]`` weight (a module named ``router`` or
  ``gate``: HF's TopKRouter modules, torchtitan's ``router.gate`` Linear) as one matrix.
- AdamW: embeddings; the output head (a Linear tied to an embedding, one whose
  ``out_features`` is an embedding's vocabulary, one named ``lm_head``, ``output``, ``head``,
  ``classifier`` or ``score`` (or inside ``lm_head``/``classifier``/``score``), a top-level
  ``fc``, or, in a model without embeddings, its last Linear when that is a child of the model
  or of nn.Sequential containers from it); input projections named like
  embeddings (``patch_embed``…); positional embeddings and tokens (``pos_embed``,
  ``cls_token``…); norms, biases, scalars; any other parameter of ndim ≥ 3 (not an expert
  stack) and any other 2-D parameter of a module that is not a known matrix layer; a matrix of
  one row or one column (an MoE's ``shared_expert_gate`` ``[1, H]``): Muon would only
  normalize it, as it does a vector.

Rules for ``(name, tensor)`` pairs (`route_named`, used for ``named_parameters()`` and named
param groups): the same rules read from the names (embeddings, positional embeddings and
tokens, heads by name or vocabulary size, the last ``….weight`` of a list without
embeddings, a ``….weight`` of one row or column, fused ``gate_up_proj`` stacks, routers); other
matrices go to Muon by shape, as for bare tensors. Each role has one reason text in both forms,
so a model and its names give the same decisions but where only the module knows (a Conv1D's
transposition, a 2-D parameter of a module that is not a matrix layer).

Rules for bare tensors (`route_params`): by shape (``ndim ≥ 2`` → Muon, a matrix of one row
too: without a name its role is unknown; 3-D: a stack of matrices; ≥ 4-D: a convolution
flattened after dim 0), with one warning naming the
matrices whose role (embedding, head…) cannot be known without names.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Callable, Iterable

import torch
from torch import nn

_HEAD_LEAVES = frozenset({"lm_head", "output", "head", "classifier", "score"})
_HEAD_CONTAINERS = frozenset({"lm_head", "classifier", "score"})
_TOP_LEVEL_HEADS = frozenset({"fc"})
_EMBEDDING_NAMES = frozenset({"wte", "emb", "tok_emb"})
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
# Positional embeddings, learned tokens and position bias tables: pos_embed, position_embeddings,
# cls_token, register_tokens, T5's relative_attention_bias…
_POSITIONAL = re.compile(r"(^|_)(pos|position|positional|relative)(_|$)|^pos[a-z]*emb")
_TOKENS = re.compile(r"(^|_)tokens?$")
_EXPERT_MODULE = re.compile(r"expert|moe", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixView:
    """How Muon sees one parameter as matrices (passed to the C++ runtime's layout)."""

    batch_dims: int = 0          # 1: [E, m, n] stack of matrices; 0: one matrix (trailing dims flattened)
    row_blocks: tuple[int, ...] = ()  # rows of each block of dim 0 orthogonalized on its own (fused q, k, v)
    transposed: bool = False     # stored (in, out), as HF Conv1D: the lr adjustment uses (cols, rows)
    col_blocks: int = 0          # > 1: that many equal column blocks, each its own matrix (o_proj per head)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutedParam:
    """One parameter with its routing decision."""

    name: str
    param: nn.Parameter
    use_muon: bool
    batch_dims: int  # 1: [E, m, n] stack of matrices; 0: one matrix (trailing dims flattened)
    reason: str
    row_blocks: tuple[int, ...] = ()
    transposed: bool = False
    unnamed: bool = False  # a bare tensor: routed by shape, its role unknown

    @property
    def view(self) -> MatrixView:
        return MatrixView(batch_dims=self.batch_dims, row_blocks=self.row_blocks, transposed=self.transposed)


def default_batch_dims(param: torch.Tensor) -> int:
    """Matrix view of a bare parameter: 3-D is a stack of matrices, else one matrix."""
    return 1 if param.dim() == 3 else 0


def _is_hf_conv1d(module: nn.Module) -> bool:
    """transformers.pytorch_utils.Conv1D (GPT-2 and relatives): y = x·W + b, W is (in, out)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "weight")


def _components(path: str) -> list[str]:
    return [c.lower() for c in path.split(".") if c]


def _names_embedding(components: list[str]) -> bool:
    return any("embed" in c or c in _EMBEDDING_NAMES for c in components)


def _names_positional(components: list[str]) -> bool:
    """pos_embed, wpe, cls_token…; NOTE: not embed_tokens (the token embedding itself)."""
    return any(c == "wpe" or _POSITIONAL.search(c) or (_TOKENS.search(c) and "embed" not in c) for c in components)


def _names_router(module_path: str) -> bool:
    """An MoE router's gate: HF's ``mlp.gate`` (Qwen2-MoE, Mixtral's ``block_sparse_moe.gate``),
    torchtitan's ``moe.router.gate``, a module named ``router``."""
    components = _components(module_path)
    return bool(components) and (components[-1] in ("gate", "router") or "router" in components[:-1])


def _names_head(module_path: str) -> str:
    """Why the module at `module_path` is an output head by its name ("" if it is not)."""
    components = _components(module_path)
    if not components:
        return ""
    if components[-1] in _HEAD_LEAVES:
        return f"output head (module named {components[-1]!r})"
    inside = [c for c in components if c in _HEAD_CONTAINERS]
    if inside:
        return f"output head (inside {inside[0]!r})"
    if len(components) == 1 and components[0] in _TOP_LEVEL_HEADS:
        return f"output head (top-level module {components[0]!r})"
    return ""


# The reasons every input form gives (a module, names, param groups with names): one text per role.
_VECTOR_REASON = "a matrix of one row or column (a gate with one output): Muon would only normalize it"
_SCALAR_REASON = "fewer than 2 dims (bias, norm, scalar)"
_POSITIONAL_REASON = "positional embedding or learned token (by name)"
_EMBEDDING_REASON = "embedding"
_INPUT_EMBEDDING_REASON = "input embedding projection (by name)"
_MATRIX_REASON = "matrix"
_STACK_REASON = "3-D stack of matrices (one per expert)"
_CONV_REASON = "convolution weight (flattened)"
_QKV_REASON = "MultiheadAttention in_proj_weight (q, k, v orthogonalized separately)"
_LAST_LAYER_HEAD_REASON = "output head (the last layer of a model without embeddings)"
# NOTE: a router is a matrix on Muon, as everywhere else: Moonlight's example routes every
# ndim >= 2 parameter but the embedding and the head to Muon, torchtitan's Kimi recipe puts
# moe.router.gate.weight on Muon (its Figure 4: the router's SVD entropy gains most), and
# dion asks for every block matrix on Muon.
_ROUTER_REASON = "MoE router (module named 'router' or 'gate'): a matrix"


def _gate_up_blocks(attr: str, param: torch.Tensor, siblings: dict[str, torch.Tensor]) -> tuple[int, ...]:
    """(I, I): `param` is a fused expert stack gate_up_proj [E, 2I, H] whose sibling down_proj is
    [E, H, I] (gate rows first, as HF's experts chunk it); () otherwise."""
    down = siblings.get("down_proj")
    if attr != "gate_up_proj" or param.dim() != 3 or down is None or down.dim() != 3:
        return ()
    (experts, rows, cols), (down_experts, hidden, inner) = param.shape, down.shape
    if experts != down_experts or rows != 2 * inner or cols != hidden:
        return ()
    return (inner, inner)


_GATE_UP_REASON = "fused expert stack gate_up_proj [E, 2I, H]: gate and up orthogonalized separately per expert"


@dataclasses.dataclass
class _Decision:
    use_muon: bool = False
    reason: str = ""
    batch_dims: int = 0
    row_blocks: tuple[int, ...] = ()
    transposed: bool = False


def _bare_decision(name: str, param: torch.Tensor, expert: bool) -> _Decision:
    """A parameter that no known layer type explains, by its name and shape."""
    components = _components(name)
    if param.dim() < 2:
        return _Decision(reason=_SCALAR_REASON)
    if _names_positional(components):
        return _Decision(reason=_POSITIONAL_REASON)
    if _names_embedding(components):
        return _Decision(reason=_EMBEDDING_REASON)
    if param.dim() == 3 and expert:
        return _Decision(use_muon=True, batch_dims=1, reason=_STACK_REASON)
    if param.dim() >= 3:
        return _Decision(reason=f"{param.dim()}-D parameter not recognised as an expert stack "
                                "(no Expert/MoE module, no 'expert' in its name)")
    return _Decision(reason="2-D parameter of a module that is not a known matrix layer")


def _linear_decision(module_path: str, out_features: int, in_features: int, head_ids: dict[str, str],
                     vocab_sizes: set[int], transposed: bool, layer_weight: bool = True) -> _Decision:
    """A Linear-like weight (nn.Linear, HF Conv1D, or a `….weight` by name): Muon unless a head,
    an input projection named like an embedding or, for a layer's weight, one of one output or
    input. `vocab_sizes`: empty when a head was found by name or tying (an MLP's width may
    equal the vocabulary). `layer_weight`: False for a 2-D tensor named otherwise (its role
    unknown: its shape decides, as for a bare tensor)."""
    head = head_ids.get(module_path) or _names_head(module_path)
    if not head and out_features in vocab_sizes and out_features > in_features:
        head = "output head (out_features equals an embedding's vocabulary)"
    if head:
        return _Decision(reason=head)
    components = _components(module_path)
    if _names_embedding(components) or _names_positional(components):
        return _Decision(reason=_INPUT_EMBEDDING_REASON)
    if layer_weight and min(out_features, in_features) == 1:
        return _Decision(reason=_VECTOR_REASON)
    if transposed:
        return _Decision(use_muon=True, reason="HF Conv1D weight (stored (in, out): transposed)", transposed=True)
    return _Decision(use_muon=True, reason=_ROUTER_REASON if layer_weight and _names_router(module_path) else
                     _MATRIX_REASON)


def _apply_filter(decision: _Decision, name: str, param: torch.Tensor, chosen: bool, is_conv: bool) -> _Decision:
    """muon_filter's override of one decision."""
    if chosen == decision.use_muon:
        return decision
    if chosen and param.dim() < 2:
        raise ValueError(f"muon_filter selected parameter {name!r} of shape {tuple(param.shape)} for Muon, "
                         "which needs at least 2 dims")
    if not chosen:
        return _Decision(reason="muon_filter")
    batch_dims = 0 if is_conv else default_batch_dims(param)
    return _Decision(use_muon=True, reason="muon_filter", batch_dims=batch_dims)


def route_module(module: nn.Module, muon_filter: Callable[[str, nn.Parameter], bool] | None = None) -> list[RoutedParam]:
    """Route every parameter of `module` (shared parameters once; frozen ones too, as torch
    optimizers keep them: they train once unfrozen)."""
    embeddings = [m for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    embedding_weights = {id(m.weight) for m in embeddings}
    vocab_sizes = {m.num_embeddings for m in embeddings}
    owner: dict[int, tuple[str, nn.Module]] = {}
    for module_name, sub in module.named_modules():
        for param_name, param in sub.named_parameters(recurse=False):
            owner.setdefault(id(param), (module_name, sub))
    head_ids = _last_layer_head(module, embeddings)
    if _has_named_or_tied_head(module, embedding_weights):
        vocab_sizes = set()  # NOTE: the head is known; layers as wide as the vocabulary are layers

    routed: list[RoutedParam] = []
    for name, param in module.named_parameters():  # NOTE: yields each shared parameter once
        module_name, sub = owner[id(param)]
        attr = name.rsplit(".", 1)[-1]
        is_conv = isinstance(sub, _CONV_TYPES) and attr == "weight"
        if param.dim() < 2:
            d = _Decision(reason=_SCALAR_REASON)
        elif id(param) in embedding_weights:
            d = _Decision(reason=_POSITIONAL_REASON if _names_positional(_components(name)) else _EMBEDDING_REASON)
        elif isinstance(sub, nn.Linear) and attr == "weight":
            d = _linear_decision(module_name, sub.out_features, sub.in_features, head_ids, vocab_sizes,
                                 transposed=False)
        elif _is_hf_conv1d(sub) and attr == "weight" and param.dim() == 2:
            d = _linear_decision(module_name, param.shape[1], param.shape[0], head_ids, vocab_sizes,
                                 transposed=True)
        elif isinstance(sub, nn.MultiheadAttention) and attr in ("in_proj_weight", "q_proj_weight",
                                                                 "k_proj_weight", "v_proj_weight"):
            d = _Decision(use_muon=True, reason=_MATRIX_REASON)
            if attr == "in_proj_weight":
                rows = param.shape[0] // 3
                d = _Decision(use_muon=True, row_blocks=(rows, rows, rows), reason=_QKV_REASON)
        elif is_conv:
            components = _components(module_name)
            d = (_Decision(reason=_INPUT_EMBEDDING_REASON) if _names_embedding(components)
                 else _Decision(use_muon=True, reason=_CONV_REASON))
        elif attr == "weight" and param.dim() == 2 and _names_router(module_name):
            # NOTE: HF's routers (Qwen2MoeTopKRouter, MixtralTopKRouter) hold their [E, H] weight
            # themselves, as a Linear would.
            d = _linear_decision(module_name, param.shape[0], param.shape[1], head_ids, vocab_sizes, transposed=False)
        else:
            expert = bool(_EXPERT_MODULE.search(type(sub).__name__)) or "expert" in name.lower()
            d = _bare_decision(name, param, expert)
            blocks = _gate_up_blocks(attr, param, dict(sub.named_parameters(recurse=False))) if d.use_muon else ()
            if blocks:
                d = _Decision(use_muon=True, batch_dims=1, row_blocks=blocks, reason=_GATE_UP_REASON)
        if muon_filter is not None:
            d = _apply_filter(d, name, param, bool(muon_filter(name, param)), is_conv)
        routed.append(RoutedParam(name=name, param=param, use_muon=d.use_muon, batch_dims=d.batch_dims,
                                  reason=d.reason, row_blocks=d.row_blocks, transposed=d.transposed))
    return routed


def _has_named_or_tied_head(module: nn.Module, embedding_weights: set[int]) -> bool:
    return any((isinstance(sub, nn.Linear) or _is_hf_conv1d(sub)) and
               (_names_head(name) or id(sub.weight) in embedding_weights) for name, sub in module.named_modules())


def _last_layer_head(module: nn.Module, embeddings: list[nn.Module]) -> dict[str, str]:
    """{module path: reason} of the output head found as the model's last Linear: only in a
    model without embeddings (a classifier, regressor…) where no layer is a head by name, and
    only where that Linear is a child of the model itself or of a chain of nn.Sequential from
    it (torchvision's `fc`, an MLP classifier's last layer), not inside a block.
    NOTE: registration order stands in for the order of the forward pass; in a model with
    embeddings the head is tied or has the vocabulary's size, and its last Linear may be an
    ordinary layer (a head computed from the embedding's weight); the last Linear of a stack of
    residual blocks is a block's output projection, not a head."""
    if embeddings:
        return {}
    modules = dict(module.named_modules())
    linear = [name for name, sub in modules.items() if isinstance(sub, nn.Linear) or _is_hf_conv1d(sub)]
    if not linear or any(_names_head(name) for name in linear):
        return {}
    last = linear[-1]
    parents = [".".join(last.split(".")[:k]) for k in range(len(last.split(".")))]
    if not all(isinstance(modules[p], nn.Sequential) for p in parents[1:]):
        return {}
    return {last: _LAST_LAYER_HEAD_REASON}


def route_named(pairs: list[tuple[str, torch.Tensor]]) -> list[RoutedParam]:
    """Route (name, tensor) pairs by the module rules read from their names: embeddings,
    positional embeddings and tokens, output heads, norms and biases → AdamW; other matrices
    → Muon (3-D: a stack of matrices, except a `….weight`, a Conv1d kernel; ≥ 4-D: flattened)."""
    vocab_sizes = {int(p.shape[0]) for n, p in pairs if p.dim() == 2 and _names_embedding(_components(n))
                   and not _names_positional(_components(n))}
    has_embedding = any(_names_embedding(_components(n)) for n, p in pairs if p.dim() >= 2)
    layer_weights = [n for n, p in pairs if p.dim() == 2 and n.endswith(".weight")]
    if any(_names_head(n.rpartition(".")[0] if n.endswith(".weight") else n) for n, p in pairs if p.dim() == 2):
        vocab_sizes = set()  # NOTE: the head is known; layers as wide as the vocabulary are layers
    head_ids: dict[str, str] = {}
    # NOTE: as _last_layer_head, for a weight of a top-level module only ("fc", an MLP's "4").
    if (not has_embedding and layer_weights and layer_weights[-1].count(".") == 1
            and not any(_names_head(n.rsplit(".", 1)[0]) for n in layer_weights)):
        head_ids[layer_weights[-1].rsplit(".", 1)[0]] = _LAST_LAYER_HEAD_REASON
    siblings: dict[str, dict[str, torch.Tensor]] = {}
    for name, param in pairs:
        module_path, _, attr = name.rpartition(".")
        siblings.setdefault(module_path, {})[attr] = param
    routed = []
    for name, param in pairs:
        module_path, _, attr = name.rpartition(".")
        components = _components(name)
        if param.dim() < 2:
            d = _Decision(reason=_SCALAR_REASON)
        elif _names_positional(components):
            d = _Decision(reason=_POSITIONAL_REASON)
        elif _names_embedding(components):
            d = _Decision(reason=_EMBEDDING_REASON if param.dim() == 2 and attr == "weight" else _INPUT_EMBEDDING_REASON)
        elif param.dim() == 2 and attr == "in_proj_weight" and param.shape[0] % 3 == 0:
            rows = param.shape[0] // 3
            d = _Decision(use_muon=True, row_blocks=(rows, rows, rows), reason=_QKV_REASON)
        elif param.dim() == 2:
            path = module_path if attr == "weight" else name
            d = _linear_decision(path, int(param.shape[0]), int(param.shape[1]), head_ids, vocab_sizes,
                                 transposed=False, layer_weight=attr == "weight")
        elif param.dim() == 3 and _gate_up_blocks(attr, param, siblings[module_path]):
            d = _Decision(use_muon=True, batch_dims=1, row_blocks=_gate_up_blocks(attr, param, siblings[module_path]),
                          reason=_GATE_UP_REASON)
        elif param.dim() == 3 and (attr != "weight" or "expert" in name.lower()):
            d = _Decision(use_muon=True, batch_dims=1, reason=_STACK_REASON)
        else:
            d = _Decision(use_muon=True, reason=_CONV_REASON)
        routed.append(RoutedParam(name=name, param=param, use_muon=d.use_muon, batch_dims=d.batch_dims,
                                  reason=d.reason, row_blocks=d.row_blocks, transposed=d.transposed))
    return routed


def route_params(params: Iterable[torch.Tensor | tuple[str, torch.Tensor]], prefix: str,
                 warn: bool = True) -> list[RoutedParam]:
    """Route a plain iterable: (name, tensor) pairs by their names (`route_named`), bare tensors
    by ndim; with `warn`, one warning names the matrices whose role cannot be known."""
    items = list(params)
    pairs = []
    for idx, item in enumerate(items):
        name, param = item if isinstance(item, tuple) else (f"{prefix}[{idx}]", item)
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"parameter {name!r} is a {type(param).__name__}, not a tensor")
        pairs.append((name, param, isinstance(item, tuple)))
    if all(named for _, _, named in pairs):
        return route_named([(n, p) for n, p, _ in pairs])
    routed = []
    for name, param, named in pairs:
        if named:
            routed.extend(route_named([(name, param)]))
            continue
        use_muon = param.dim() >= 2
        routed.append(RoutedParam(name=name, param=param, use_muon=use_muon,
                                  batch_dims=default_batch_dims(param) if use_muon else 0,
                                  reason="ndim >= 2 (unnamed: role unknown)" if use_muon else "ndim < 2",
                                  unnamed=True))
    if warn:
        warn_unnamed_matrices([r for r in routed if r.unnamed and r.use_muon])
    return routed


def warn_unnamed_matrices(unknown: list[RoutedParam]) -> None:
    """One warning naming the matrices routed to Muon by shape alone (none: no warning)."""
    if not unknown:
        return
    shown = ", ".join(f"{r.name} {tuple(r.param.shape)}" for r in unknown[:6])
    more = f" and {len(unknown) - 6} more" if len(unknown) > 6 else ""
    warnings.warn(
        f"DMuon got parameters without names and routes every matrix to Muon by its shape: {shown}{more}. "
        "Embeddings and the output head cannot be recognised this way (they should use AdamW). "
        "Pass the model (DMuon(model, ...)) or names (DMuon(model.named_parameters(), ...), or (name, "
        "tensor) pairs in param groups), or set use_muon=True/False per param group.",
        UserWarning, stacklevel=4)
