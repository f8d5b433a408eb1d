"""Muon-matrix manifests: shipped JSON files, user JSON manifests, Hugging Face config.json.

A manifest is JSON: ``{"name": str, "matrices": [{"name": str, "rows": int, "cols": int,
"count": int = 1, "batch": int = 1}, ...]}``. ``count`` repeats a matrix (e.g. once per
layer; a ``{i}`` in its name is replaced by the index), ``batch`` makes it a 3-D stack
(MoE experts). Shapes are PyTorch ``Linear.weight`` shapes (out × in). Embeddings and the
output head are not Muon matrices (they go to AdamW).

Stacks are planned whole, or (``split_experts``) one matrix per expert, as the step
engine does; ``split_experts(..., world=D)`` also gives each expert its home under
FSDP2's Shard(0) on the expert dim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

_MANIFEST_DIR = "manifests"


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """One Muon parameter: rows × cols, or a stack of ``batch`` such matrices."""

    name: str
    rows: int
    cols: int
    batch: int = 1
    home: int = -1  # rank that already holds it whole (-1: none)


@dataclass(frozen=True, kw_only=True)
class Manifest:
    name: str
    matrices: tuple[Matrix, ...]


def read_json(path: str | Path) -> object:
    """Parses a JSON file; errors name the file and the line:column of the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"{path}: cannot read: {error.strerror}") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}:{error.colno}: malformed JSON: {error.msg}") from error


def shipped_models() -> list[str]:
    """Names of the manifests that ship with the package."""
    folder = resources.files("dmuon.cli.plan") / _MANIFEST_DIR
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def split_experts(manifest: Manifest, *, world: int | None = None) -> Manifest:
    """Each 3-D stack as one matrix per expert (``layers.3.mlp.experts.gate_proj`` with 128
    experts → ``layers.3.mlp.experts.0.gate_proj`` … ``.127.gate_proj``).

    ``world``: model FSDP2's Shard(0) over the expert dim on ``world`` ranks, which follows
    ``torch.chunk``: chunks of ceil(E / world) experts, expert e whole on rank
    e // ceil(E / world) (ranks past the last chunk hold none), so that rank is its home.
    """
    if world is not None and world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    out: list[Matrix] = []
    for m in manifest.matrices:
        if m.batch == 1:
            out.append(m)
            continue
        head, dot, tail = m.name.rpartition(".")
        chunk = -(-m.batch // world) if world is not None else 0
        for e in range(m.batch):
            name = f"{head}.{e}.{tail}" if dot else f"{m.name}.{e}"
            home = e // chunk if world is not None and world > 1 else -1
            out.append(Matrix(name=name, rows=m.rows, cols=m.cols, home=home))
    return Manifest(name=manifest.name, matrices=tuple(out))


def load_model(name: str) -> Manifest:
    """A shipped manifest by name (case-insensitive)."""
    models = shipped_models()
    match = [m for m in models if m.lower() == name.lower()]
    if not match:
        raise ValueError(f"--model {name!r} is not a shipped manifest; choose one of {', '.join(models)}")
    path = resources.files("dmuon.cli.plan") / _MANIFEST_DIR / f"{match[0]}.json"
    with resources.as_file(path) as file:
        return load_manifest(file, name=match[0])


def load_manifest(path: str | Path, *, name: str | None = None) -> Manifest:
    """A JSON manifest, or a Hugging Face config.json (recognized by its hidden_size);
    ``name`` for a config (default: its folder's name)."""
    data = read_json(path)
    if isinstance(data, dict) and "hidden_size" in data:
        return manifest_from_config(data, name=name or Path(path).parent.name or Path(path).stem, source=str(path))
    return _parse_manifest(data, source=str(path))


def _parse_manifest(data: object, *, source: str) -> Manifest:
    if not isinstance(data, dict) or not isinstance(data.get("matrices"), list):
        raise ValueError(f"{source}: a manifest is an object with a 'matrices' list")
    entries = data["matrices"]
    if not entries:
        raise ValueError(f"{source}: the manifest lists no matrices (empty manifest)")
    matrices: list[Matrix] = []
    for i, entry in enumerate(entries):
        where = f"{source}: matrices[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
        for key in ("rows", "cols"):
            if not isinstance(entry.get(key), int) or entry[key] < 1:
                raise ValueError(f"{where}: '{key}' must be a positive integer, got {entry.get(key)!r}")
        for key in ("count", "batch"):
            if not isinstance(entry.get(key, 1), int) or entry.get(key, 1) < 1:
                raise ValueError(f"{where}: '{key}' must be a positive integer, got {entry.get(key)!r}")
        name = str(entry.get("name", f"matrix{i}"))
        count = entry.get("count", 1)
        for j in range(count):
            if "{i}" in name:
                full = name.replace("{i}", str(j))
            else:
                full = f"{name}[{j}]" if count > 1 else name
            matrices.append(Matrix(name=full, rows=entry["rows"], cols=entry["cols"], batch=entry.get("batch", 1)))
    return Manifest(name=str(data.get("name", Path(source).stem)), matrices=tuple(matrices))


def _int(config: dict, key: str, source: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{source}: config key '{key}' must be a positive integer, got {value!r}")
    return value


def manifest_from_config(config: dict, *, name: str = "config", source: str = "config.json") -> Manifest:
    """Muon matrices of a Llama/Qwen/Mistral-style decoder from its config.json values.

    Per layer: q (heads·d × h), k and v (kv·d × h), o (h × heads·d); a dense MLP gate and
    up (i × h) and down (h × i); or, for MoE layers (num_experts / num_local_experts), the
    router (E × h) and expert stacks gate/up (E: i_moe × h) and down (E: h × i_moe) plus
    Qwen2-MoE's shared expert. Qwen2-MoE's decoder_sparse_step and mlp_only_layers choose
    which layers are MoE. Qwen2-MoE's 1 × h shared_expert_gate is a vector-like gate and is
    left to AdamW, like embeddings and the head.
    """
    h = _int(config, "hidden_size", source)
    layers = _int(config, "num_hidden_layers", source)
    heads = _int(config, "num_attention_heads", source)
    kv_heads = _int(config, "num_key_value_heads", source, heads)
    head_dim = config.get("head_dim") or h // heads
    head_dim = _int({"head_dim": head_dim}, "head_dim", source)
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    if experts:
        experts = _int({"num_experts": experts}, "num_experts", source)
        moe_i = _int(config, "moe_intermediate_size" if "moe_intermediate_size" in config else "intermediate_size", source)
        shared_i = config.get("shared_expert_intermediate_size") or 0
        sparse_step = config.get("decoder_sparse_step") or 1
        dense_layers = set(config.get("mlp_only_layers") or [])
    matrices: list[Matrix] = []
    for layer in range(layers):
        prefix = f"layers.{layer}"
        matrices += [
            Matrix(name=f"{prefix}.self_attn.q_proj", rows=heads * head_dim, cols=h),
            Matrix(name=f"{prefix}.self_attn.k_proj", rows=kv_heads * head_dim, cols=h),
            Matrix(name=f"{prefix}.self_attn.v_proj", rows=kv_heads * head_dim, cols=h),
            Matrix(name=f"{prefix}.self_attn.o_proj", rows=h, cols=heads * head_dim),
        ]
        moe_layer = experts and layer not in dense_layers and (layer + 1) % sparse_step == 0
        if moe_layer:
            matrices += [
                Matrix(name=f"{prefix}.mlp.gate", rows=experts, cols=h),
                Matrix(name=f"{prefix}.mlp.experts.gate_proj", rows=moe_i, cols=h, batch=experts),
                Matrix(name=f"{prefix}.mlp.experts.up_proj", rows=moe_i, cols=h, batch=experts),
                Matrix(name=f"{prefix}.mlp.experts.down_proj", rows=h, cols=moe_i, batch=experts),
            ]
            if shared_i:
                matrices += [
                    Matrix(name=f"{prefix}.mlp.shared_expert.gate_proj", rows=shared_i, cols=h),
                    Matrix(name=f"{prefix}.mlp.shared_expert.up_proj", rows=shared_i, cols=h),
                    Matrix(name=f"{prefix}.mlp.shared_expert.down_proj", rows=h, cols=shared_i),
                ]
        else:
            i = _int(config, "intermediate_size", source)
            matrices += [
                Matrix(name=f"{prefix}.mlp.gate_proj", rows=i, cols=h),
                Matrix(name=f"{prefix}.mlp.up_proj", rows=i, cols=h),
                Matrix(name=f"{prefix}.mlp.down_proj", rows=h, cols=i),
            ]
    return Manifest(name=name, matrices=tuple(matrices))
