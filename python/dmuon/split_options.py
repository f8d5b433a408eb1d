"""Split orthogonalization (issue 29): Muon group options that cut each weight of the group
into blocks of rows, each orthogonalized (and lr-adjusted) as a matrix of its own.

- ``split_rows=[q, k, v]``: the sizes along dim 0 of every parameter of the group, in order,
  summing to its rows (a fused ``qkv_proj``; ``[i, i]`` for a fused ``gate_up_proj``).
- ``split_heads=n``: ``n`` equal blocks of ``rows / n`` rows (per-head q, k, v; for a fused
  GQA q, k, v pass the total number of heads, q's and k's and v's).

Defaults (None) keep whole matrices. The momentum buffer stays one tensor per parameter, so
the state_dict is the same with or without a split. A split refines the matrices DMuon
already sees: a parameter whose view has row blocks already (``nn.MultiheadAttention``'s
``in_proj_weight``) keeps every boundary of them. Not built: column blocks (``o_proj`` per
head is a split of its columns: a rank's piece of a column block would not be contiguous in
its Shard(0) rows), a split of a 3-D expert stack and of a matrix stored transposed (HF
``Conv1D``, whose dim 0 is the input).
"""

from __future__ import annotations

from typing import Any

import torch

from dmuon.routing import MatrixView

# Keys of a Muon group (None: whole matrices).
SPLIT_DEFAULTS = {"split_rows": None, "split_heads": None}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_split_options(group: dict[str, Any], where: str) -> None:
    """Raise ValueError naming the option when a group's split options are malformed
    (normalizes ``split_rows`` to a tuple). Per-parameter fit: split_view."""
    rows, heads = group.get("split_rows"), group.get("split_heads")
    if rows is not None:
        try:
            sizes = tuple(rows)
        except TypeError:
            raise ValueError(f"{where}split_rows must be None or a sequence of positive row counts, "
                             f"got {rows!r}") from None
        if not sizes or not all(_positive_int(s) for s in sizes):
            raise ValueError(f"{where}split_rows must be None or a non-empty sequence of positive integers, "
                             f"got {rows!r}")
        group["split_rows"] = sizes
    if heads is not None and not _positive_int(heads):
        raise ValueError(f"{where}split_heads must be None or a positive integer (the number of heads), got {heads!r}")
    if rows is not None and heads is not None:
        raise ValueError(f"{where}split_rows and split_heads are both set ({rows!r}, {heads!r}); set one "
                         "(for per-head blocks of a fused q, k, v, split_heads = the total number of heads)")


def split_blocks(group: dict[str, Any], dim0: int) -> tuple[int, ...] | None:
    """The row blocks a group's split gives a parameter of `dim0` rows (None: no split).
    Assumes check_split_options passed; the sum/divisibility checks are split_view's."""
    if group.get("split_rows") is not None:
        return tuple(group["split_rows"])
    heads = group.get("split_heads")
    if heads is not None:
        return (dim0 // heads,) * heads if dim0 % heads == 0 else None
    return None


def split_view(view: MatrixView, param: torch.Tensor, group: dict[str, Any], name: str, where: str) -> MatrixView:
    """`view` (how routing sees the parameter) with the group's split applied; ValueError
    naming the parameter and the option when the split does not fit it."""
    rows, heads = group.get("split_rows"), group.get("split_heads")
    if rows is None and heads is None:
        return view
    option = f"split_rows={list(rows)}" if rows is not None else f"split_heads={heads}"
    what = f"{where}{option} for parameter {name!r} of shape {tuple(param.shape)}"
    if view.batch_dims != 0:
        raise ValueError(f"{what}: it is a stack of matrices (experts); a split applies to one matrix per parameter")
    if view.transposed:
        raise ValueError(f"{what}: it is stored transposed (in, out), so its dim 0 is the input; splitting the "
                         "columns of a matrix (e.g. o_proj per head, or HF Conv1D's fused c_attn) is not supported")
    dim0 = int(param.shape[0])
    if heads is not None and dim0 % heads:
        raise ValueError(f"{what}: {dim0} rows are not divisible into {heads} heads")
    blocks = split_blocks(group, dim0)
    if sum(blocks) != dim0:
        raise ValueError(f"{what}: the blocks sum to {sum(blocks)} rows, the parameter has {dim0}")
    ends = {sum(blocks[: i + 1]) for i in range(len(blocks))}
    base = [sum(view.row_blocks[: i + 1]) for i in range(len(view.row_blocks))]
    missing = [e for e in base if e not in ends]
    if missing:
        raise ValueError(f"{what}: DMuon orthogonalizes it as row blocks {list(view.row_blocks)} already; a split "
                         f"must keep their boundaries (row {missing[0]} is inside one of its blocks)")
    return MatrixView(batch_dims=0, row_blocks=() if len(blocks) == 1 else blocks, transposed=False)


def split_key(param_groups: list[dict[str, Any]]) -> tuple:
    """The split options of every group (the runtime is rebuilt when they change)."""
    return tuple((g.get("split_rows"), g.get("split_heads")) for g in param_groups)
