"""The 2-D fake mesh of `bench step --fake-mesh DPxTP`: FSDP2 on the DP mesh dim, tensor
parallelism on the TP dim, each Muon matrix placed as torchtitan's Llama plan places it.

- colwise (q/k/v, gate/up; torchtitan wq/wk/wv, w1/w3): ``Shard(0)`` on TP; FSDP2 then
  shards the TP-local rows again on DP, its ``_StridedShard(0, split_factor=TP)``: rank
  (d, t) holds DP-chunk d of TP-chunk t of the rows;
- rowwise (o, down; torchtitan wo, w2): ``Shard(1)`` on TP, ``Shard(0)`` on DP;
- any other matrix (and every 3-D stack): ``Shard(0)`` on DP, replicated over TP.

Global rank = d · TP + t (the mesh is row-major), so a TP group is TP consecutive ranks: on
one node when TP divides --gpus-per-node. DMuon's exchange runs on the union group, the
whole fake world.
"""

from __future__ import annotations

from dmuon.cli.bench.step_inputs import chunk_length

# NOTE: the last component of the matrix's name (HF and torchtitan spellings).
COLWISE = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "q", "k", "v", "gate", "up",
                     "wq", "wk", "wv", "w1", "w3"})
ROWWISE = frozenset({"o_proj", "down_proj", "o", "down", "wo", "w2"})
STYLES = ("colwise", "rowwise", "replicate")


def tp_style(name: str, shape: tuple) -> str:
    """How TP places the matrix `name` of `shape`: colwise, rowwise or replicate."""
    if len(shape) != 2:
        return "replicate"
    leaf = name.rsplit(".", 1)[-1]
    return "colwise" if leaf in COLWISE else "rowwise" if leaf in ROWWISE else "replicate"


def local_shape(shape: tuple, style: str, d: int, t: int, dp: int, tp: int) -> tuple:
    """The local tensor's shape on mesh coordinates (d, t)."""
    if style == "colwise":
        return (chunk_length(chunk_length(shape[0], t, tp), d, dp), *shape[1:])
    if style == "rowwise":
        return (chunk_length(shape[0], d, dp), chunk_length(shape[1], t, tp))
    return (chunk_length(shape[0], d, dp), *shape[1:])


def placements(style: str, tp: int) -> list:
    """The DTensor placements of `style` on the (DP, TP) mesh."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if style == "colwise":
        return [_StridedShard(0, split_factor=tp), Shard(0)]
    if style == "rowwise":
        return [Shard(0), Shard(1)]
    return [Shard(0), Replicate()]


def describe(style: str) -> str:
    return {"colwise": "(_StridedShard(0), Shard(0))", "rowwise": "(Shard(0), Shard(1))",
            "replicate": "(Shard(0), Replicate())"}[style]
