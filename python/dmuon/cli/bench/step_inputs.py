"""What `bench step` and `bench step --fake-world` share: the manifest's matrices, the
argument checks, the shards FSDP2 lays out and the DMuon they time."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class BenchModel:
    """The matrices a run steps, as the workers and the report need them."""

    name: str
    shapes: list  # (rows, cols), or (batch, rows, cols) for a stack, of every Muon matrix
    names: list
    num_params: int
    wire: str  # --wire-dtype resolved: bfloat16 on CUDA, float32 on the CPU

    def line(self, args, layout: str) -> str:
        """The report's model line: matrices, their layout and the settings every method shares."""
        return (f"model {self.name}: {len(self.shapes)} Muon matrices, {self.num_params / 1e6:.1f} M parameters, "
                f"float32, {layout} | wire {self.wire} | buckets of {args.bucket_mb:g} MiB | planner {args.planner} "
                f"| median of {args.steps} steps after {args.warmup} warm-up")


def bench_model(args, device: str) -> BenchModel:
    """The BenchModel of --model or --manifest (matrices_of) on `device`."""
    name, matrices = matrices_of(args)
    wire = args.wire_dtype if args.wire_dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    return BenchModel(name, [(m.batch, m.rows, m.cols) if m.batch > 1 else (m.rows, m.cols) for m in matrices],
                      [m.name for m in matrices], sum(m.rows * m.cols * m.batch for m in matrices), wire)


def dmuon_of(names: list, params: list, mode: str, options: dict, **execution):
    """DMuon over the named parameters in `mode` with the run's --bucket-mb, --planner and
    --wire-dtype (`options`) and `execution`'s further Execution fields."""
    import dmuon

    return dmuon.DMuon(list(zip(names, params)), lr=1e-3, execution=dmuon.Execution(
        mode=mode, bucket_size_mb=options["bucket_mb"], planner=options["planner"], wire_dtype=options["wire_dtype"],
        **execution))


def check_counts(args) -> None:
    """--steps, --warmup, --profile-steps and --bucket-mb in range."""
    from dmuon.cli.usage import check_at_least

    check_at_least(args, steps=1, warmup=0, profile_steps=0, bucket_mb=0)


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

