"""Rank functions of test_all_modes_parity.py: one small model stepped by DMuon in every
distributed mode, against the pure-PyTorch float64 reference (dmuon.reference) on the same
gradients.

The model's forward makes each layer's weight gradient a chosen matrix exactly: layer k
computes I·Wₖᵀ + bₖ (I the identity) and the loss is Σ (that ∘ Gₖᵀ), so ∂loss/∂Wₖ = Gₖ
whatever the mode's wrapper (FSDP2, DDP, weight ownership) does in forward and backward, up
to the rounding of its gradient average (exact at worlds 2 and 4)."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import dmuon
from dmuon.reference import ReferenceDMuon
from dist_workers import _device
from worker_tensors import default_reference_groups, update_errors, wholes

# (out, in) of each layer: tall, dim 0 smaller than world 3 (an empty shard), uneven under
# world 3 (7 = 3 + 3 + 1), wide.
SHAPES = [(12, 5), (2, 9), (7, 6), (16, 24)]
NUM_STEPS = 2
OPTIONS = dict(lr=0.02, weight_decay=0.1, ns_algorithm="gram", bucket_size_mb=0.0005)


class ProbeModel(nn.Module):
    """Linear layers whose weight gradients are set by the loss (module docstring); the first
    layer has a bias (an AdamW parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=(k == 0)) for k, (o, i) in enumerate(SHAPES))

    def forward(self, targets: list[torch.Tensor]) -> torch.Tensor:
        loss = torch.zeros((), device=targets[0].device)
        for layer, g in zip(self.layers, targets):
            out = layer(torch.eye(layer.in_features, dtype=g.dtype, device=g.device))
            loss = loss + (out * g.T).sum()
        return loss


def wrap(model: nn.Module, kind: str, world: int) -> nn.Module:
    """`model` on this rank's device under `kind`: "fsdp2" (fully_shard on each layer and on
    the root), "hsdp" (the same on a 2 × world/2 mesh), "ddp" (tiny buckets: several, handed
    over inside backward); any other kind leaves it as it is."""
    device = _device()
    model.to(device)
    if kind in ("fsdp2", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        # NOTE: dimension names of these tests' own: a pooled rank that an earlier task gave a
        # ("replicate", "shard") mesh resolved the new mesh's groups through torch's mesh
        # cache to that task's destroyed groups ("Could not resolve the process group
        # registered under the name 7", after test_distributed's HSDP test).
        mesh = (init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("probe_replicate", "probe_shard"))
                if kind == "hsdp" else init_device_mesh(device.type, (world,)))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=1e-4,
                                                   device_ids=[device.index] if device.type == "cuda" else None)
    return model


def _targets(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=gen) / s[1] ** 0.5 for s in SHAPES]


# The float64 mode's last layer (16 × 24) as three row blocks of unequal sizes (a fused
# qkv under grouped-query attention), cut by world 3's shards inside the first and last.
ROW_BLOCKS = (8, 5, 3)


def _reference_groups(model: nn.Module, row_blocks: bool = False) -> list[dict]:
    """DMuon's defaults (and OPTIONS) as ReferenceDMuon groups: weights Muon, bias AdamW."""
    weights = [layer.weight for layer in model.layers]
    groups = default_reference_groups(weights, [layer.bias for layer in model.layers if layer.bias is not None],
                                      OPTIONS)
    if row_blocks:
        groups[0]["row_blocks"] = [()] * (len(weights) - 1) + [ROW_BLOCKS]
    return groups


def mode_matches_reference(rank: int, world: int, mode: str) -> dict:
    """NUM_STEPS steps of DMuon in `mode` ("local", "fsdp2", "ddp", "hsdp", "gather",
    "ownership", "ownership_mixed": only the first two layers owned, the others replicas
    stepped by the engine, "fsdp2_float64_blocks": FSDP2 of a float64 model whose last
    layer is three row blocks of unequal sizes) and of ReferenceDMuon on the same gradients;
    per parameter, the error of DMuon's total update relative to the reference's, and which
    runtime stepped it."""
    torch.manual_seed(0)
    reference = ProbeModel()
    float64 = mode == "fsdp2_float64_blocks"
    if float64:
        reference = reference.double()
    model = copy.deepcopy(reference)
    initial = wholes(reference)
    ref_opt = ReferenceDMuon(_reference_groups(reference, row_blocks=float64))
    owned = None
    options = dict(OPTIONS, mode="gather") if mode == "gather" else OPTIONS
    wrapped = wrap(model, "fsdp2" if mode in ("gather", "fsdp2_float64_blocks") else mode, world)
    if mode in ("ownership", "ownership_mixed"):
        first_two = {f"layers.{k}.weight" for k in (0, 1)}
        predicate = (lambda name, p: name in first_two) if mode == "ownership_mixed" else None
        owned = dmuon.own_matrices(model, predicate=predicate, bucket_size_mb=0.0005, replicate_others=True)
    opt = dmuon.DMuon(model, **options)
    if float64:
        # NOTE: no user option makes unequal blocks (routing makes equal ones for fused
        # attention); set the view the runtime is built from, as gpu_reference does.
        opt._params.set_view(model.layers[-1].weight, dmuon.MatrixView(row_blocks=ROW_BLOCKS))
    for step in range(NUM_STEPS):
        targets = _targets(step)
        if float64:
            targets = [t.double() for t in targets]
        for p in reference.parameters():
            p.grad = None
        reference(targets).backward()
        ref_opt.step()
        opt.zero_grad()
        wrapped(targets).backward()
        opt.step()
    with owned.materialized(opt) if owned is not None else contextlib.nullcontext():
        errors = update_errors(model, initial, reference, initial)
    # NOTE: one engine steps every Muon parameter, owned or not.
    runtime = type(opt.runtime).__name__
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    num_owned = 0 if owned is None else len(owned.params)
    return {"errors": errors, "runtime": runtime, "world": world_size, "num_owned": num_owned,
            "num_engine_params": len(opt.runtime.owners)}
