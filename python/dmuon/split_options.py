"""Split orthogonalization: Muon group options that cut each weight of the group
into blocks of rows or of columns, each orthogonalized (and lr-adjusted) as a matrix of its
own.

- ``split_rows=[q, k, v]``: the sizes along dim 0 of every parameter of the group, in order,
  summing to its rows (a fused ``qkv_proj``; ``[i, i]`` for a fused ``gate_up_proj``).
- ``split_heads=n``: ``n`` equal blocks of ``rows / n`` rows (per-head q, k, v; for a fused
  GQA q, k, v pass the total number of heads, q's and k's and v's).
- ``split_dim``: ``0`` or None (rows, the default) or ``1``: with ``split_heads=n``, ``n``
  equal blocks of ``cols / n`` columns (``o_proj`` / ``out_proj`` per head: its weight is
  [hidden, heads·head_dim], head j is columns [j·d, (j+1)·d); each block is a hidden×d
  matrix). Column blocks take equal heads only (no ``split_rows`` with it).

Defaults (None) keep whole matrices. The momentum buffer stays one tensor per parameter, so
the state_dict is the same with or without a split. A split refines the matrices DMuon
already sees: a parameter whose view has row blocks already (``nn.MultiheadAttention``'s
``in_proj_weight``) keeps every boundary of them. Not built: a split of a 3-D expert stack
and of a matrix stored transposed (HF ``Conv1D``, whose dim 0 is the input); column blocks
of a parameter that has row blocks, of one with more than 2 dims, or of a DTensor on a mesh
of several dims (FSDP2 × TP).

How column blocks run: each block is an item of the C++ step engine (layout::ParamLayout::
col_blocks, step/items.h): a rank's piece of block j is its rows × columns [j·d, (j+1)·d)
of its local tensor, read and written in place as a strided view (rows `cols` elements
apart) and exchanged as a contiguous slice, so nothing is copied for the split.
"""

from __future__ import annotations

from typing import Any

import torch

from dmuon.routing import MatrixView

# Keys of a Muon group (None: whole matrices).
SPLIT_DEFAULTS = {"split_rows": None, "split_heads": None, "split_dim": None}


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
    dim = group.get("split_dim")
    if dim is not None and (isinstance(dim, bool) or dim not in (0, 1)):
        raise ValueError(f"{where}split_dim must be None, 0 (rows) or 1 (columns), got {dim!r}")
    if dim == 1 and rows is not None:
        raise ValueError(f"{where}split_dim=1 (column blocks) takes split_heads=n (equal blocks), not "
                         f"split_rows={rows!r}")
    if dim == 1 and heads is None:
        raise ValueError(f"{where}split_dim=1 (column blocks) needs split_heads=n, the number of column blocks "
                         "(e.g. o_proj's number of attention heads)")
    # NOTE: NorMuon's state is one value per row of the parameter; a column block's rows are
    # the parameter's rows again, once per block, so their v would not be the state's.
    if dim == 1 and group.get("normuon"):
        raise ValueError(f"{where}split_dim=1 (column blocks) cannot be combined with normuon=True (NorMuon's "
                         "per-row state is per parameter row; split rows, or leave this group unsplit)")
    if rows is not None and heads is not None:
        raise ValueError(f"{where}split_rows and split_heads are both set ({rows!r}, {heads!r}); set one "
                         "(for per-head blocks of a fused q, k, v, split_heads = the total number of heads)")


def splits_cols(group: dict[str, Any]) -> bool:
    """Whether the group's split cuts columns (split_dim=1)."""
    return group.get("split_dim") == 1


def split_blocks(group: dict[str, Any], dim0: int) -> tuple[int, ...] | None:
    """The row blocks a group's split gives a parameter of `dim0` rows (None: no split, or a
    column split). Assumes check_split_options passed; the sum/divisibility checks are
    split_view's."""
    if splits_cols(group):
        return None
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
    if splits_cols(group):
        option += ", split_dim=1"
    what = f"{where}{option} for parameter {name!r} of shape {tuple(param.shape)}"
    if view.batch_dims != 0:
        raise ValueError(f"{what}: it is a stack of matrices (experts); a split applies to one matrix per parameter")
    if view.transposed:
        raise ValueError(f"{what}: it is stored transposed (in, out), so its dim 0 is the input; splitting the "
                         "columns of a matrix (e.g. o_proj per head, or HF Conv1D's fused c_attn) is not supported")
    if splits_cols(group):
        return _col_view(view, param, heads, what)
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


def _col_view(view: MatrixView, param: torch.Tensor, heads: int, what: str) -> MatrixView:
    """The view of `heads` equal column blocks of a 2-D parameter (split_view's checks passed)."""
    if param.dim() != 2:
        raise ValueError(f"{what}: column blocks take a 2-D weight ([out, heads·head_dim], e.g. o_proj), not "
                         f"{param.dim()}-D")
    if view.row_blocks:
        raise ValueError(f"{what}: DMuon orthogonalizes it as row blocks {list(view.row_blocks)} already; column "
                         "blocks of a matrix split by rows are not supported")
    cols = int(param.shape[1])
    if cols % heads:
        raise ValueError(f"{what}: {cols} columns are not divisible into {heads} heads")
    return MatrixView(batch_dims=0, col_blocks=heads if heads > 1 else 0, transposed=False)


def split_key(param_groups: list[dict[str, Any]]) -> tuple:
    """The split options of every group (the runtime is rebuilt when they change)."""
    return tuple((g.get("split_rows"), g.get("split_heads"), g.get("split_dim")) for g in param_groups)
