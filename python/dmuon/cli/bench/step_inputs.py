"""What `bench step` and `bench step --fake-world` share: the manifest's matrices, the
argument checks, the shards FSDP2 lays out, and the JSON record written whole."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def matrices_of(args) -> tuple[str, list]:
    """(manifest name, its Muon matrices) of --model or --manifest, the first --max-matrices."""
    from dmuon.cli.plan.manifest import load_manifest, load_model

    manifest = load_model(args.model) if args.model else load_manifest(args.manifest)
    matrices = list(manifest.matrices)
    if args.max_matrices < 0:
        raise ValueError(f"--max-matrices must be >= 0, got {args.max_matrices}")
    if args.max_matrices:
        matrices = matrices[: args.max_matrices]
    return manifest.name, matrices


def check_counts(args) -> None:
    """--steps, --warmup, --profile-steps and --bucket-mb in range."""
    for name in ("steps", "warmup", "profile_steps"):
        value = getattr(args, name)
        if value is None:
            continue
        if value < (1 if name == "steps" else 0):
            raise ValueError(f"--{name.replace('_', '-')} must be >= {1 if name == 'steps' else 0}, got {value}")
    if not args.bucket_mb >= 0:
        raise ValueError(f"--bucket-mb must be >= 0, got {args.bucket_mb}")


def parse_methods(text: str) -> list[str]:
    """--mode: 'all' or a comma list of owner, gather (fused AdamW always runs too)."""
    names = ["owner", "gather"] if text == "all" else [m.strip() for m in str(text).split(",") if m.strip()]
    bad = [m for m in names if m not in ("owner", "gather")]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"--mode must be 'all' or a comma list of owner, gather (each once), got {text!r}")
    return names


def chunk_length(size: int, index: int, parts: int) -> int:
    """Length of torch.chunk's piece `index` of `size` in `parts` (the last ones may be empty):
    the rows of dim 0 on rank `index` of `parts` under Shard(0)."""
    chunk = -(-size // parts)
    begin = min(index * chunk, size)
    return min(begin + chunk, size) - begin


def sharded_tensors(shapes: list, mesh, rank: int, world: int, seed: int, device: str, placements=None) -> list:
    """DTensors sharded on dim 0 over `world` ranks (rank: this one's place among them), each
    rank drawing its own rows on its device (no full tensor is ever made: the 7B matrices are
    26 GB in float32). placements: default [Shard(0)] (HSDP: [Replicate(), Shard(0)])."""
    from torch.distributed.tensor import DTensor, Shard

    gen = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    tensors = []
    for shape in shapes:
        local = torch.randn((chunk_length(shape[0], rank, world), *shape[1:]), generator=gen, device=device)
        local /= shape[-1] ** 0.5
        stride = torch.empty(shape, device="meta").stride()
        tensors.append(DTensor.from_local(local, mesh, placements or [Shard(0)], run_check=False,
                                          shape=torch.Size(shape), stride=stride))
    return tensors


def write_json(path: Path | None, record: dict) -> None:
    """`record` written to `path` (None: nowhere) through a temporary file, never half-written."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
