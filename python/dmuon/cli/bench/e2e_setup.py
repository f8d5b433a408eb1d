"""What `bench e2e` and `bench e2e --fake-world` share: the argument checks, the FSDP2-sharded
model with its optimizer, the rank's tokens, and the share of the Newton–Schulz begun from
backward."""

from __future__ import annotations

import torch


def micro_batch_arg(value: str) -> int | None:
    """None for 'auto', else a positive integer."""
    if value == "auto":
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise ValueError(f"--micro-batch must be 'auto' or a positive integer, got {value!r}")
    return int(value)


def check_args(args) -> None:
    """--seq, --steps, --warmup and --max-micro-batch in range; a Hugging Face --model needs
    `transformers` (an ImportError here, before any process starts)."""
    from dmuon.cli.bench.e2e_models import HF_CONFIGS, require_transformers
    from dmuon.cli.usage import check_at_least

    check_at_least(args, seq=2, steps=1, warmup=0, max_micro_batch=1)
    if args.model in HF_CONFIGS:
        require_transformers(args.model)


def torch_device(device: str) -> torch.device:
    """This process's device of `device` ("cuda": its current GPU, or "cpu")."""
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def random_tokens(spec, micro_batch: int, seq: int, seed: int, rank: int, device: torch.device) -> torch.Tensor:
    """A rank's [micro_batch, seq] token ids of `spec`'s vocabulary (its own generator per seed and rank)."""
    gen = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    return torch.randint(0, spec.vocab_size, (micro_batch, seq), generator=gen, device=device)


def mixed_precision(device: str):
    """bf16 compute with float32 master weights and gradient reduction on GPUs; float32 on CPUs."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def build_sharded(spec, name: str, mesh, mp_policy, torch_device: torch.device, settings, seed: int,
                  before_optimizer=None):
    """A fresh model from `seed`, prepared by the optimizer entry `name`, sharded by FSDP2 on
    `mesh` (each decoder layer, then the root), with its optimizer; the parameter counts
    (the model's Muon matrices checked against its config first); and the `dmuon.OwnedMatrices`
    the entry's prepare made (None if none). `before_optimizer(model)`, if given, runs on the
    sharded model before the optimizer is built."""
    from torch.distributed.fsdp import fully_shard

    from dmuon import route_module
    from dmuon.cli.bench.e2e_models import check_muon_shapes
    from dmuon.cli.bench.e2e_optimizers import OPTIMIZERS

    entry = OPTIMIZERS[name]
    torch.manual_seed(seed)
    with torch_device:
        model = spec.build()
    model = model.to(torch_device).train()
    check_muon_shapes(model, spec.name)
    routed = route_module(model)
    counts = {"total": sum(r.param.numel() for r in routed), "muon": sum(r.param.numel() for r in routed if r.use_muon),
              "muon_matrices": sum(1 for r in routed if r.use_muon)}
    extra = dict((entry.prepare(model, mesh, settings) if entry.prepare is not None else None) or {})
    owned = extra.pop("owned", None)
    for block in spec.blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, **extra)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, **extra)
    if before_optimizer is not None:
        before_optimizer(model)
    return model, entry.build(model, settings), counts, owned


def early_ns_share(stats) -> float | None:
    """Share of this rank's Newton–Schulz matrices that ran before backward ended, inside
    its hooks (the step begun from backward, dmuon.backward_step; step() hands nothing
    over): its early stages', counted in matrices (device-independent; seconds on GPUs
    would time enqueueing)."""
    return stats.early_orthogonalized / stats.num_orthogonalized if stats.num_orthogonalized else None


def backward_step_on(opt) -> bool:
    """Whether `opt`, a DMuon after its first step, begins its step inside backward (its
    runtime's `backward_order`, resolved from Execution.backward_step); False for any other
    optimizer."""
    import dmuon

    return isinstance(opt, dmuon.DMuon) and bool(opt.runtime.options.backward_order)
