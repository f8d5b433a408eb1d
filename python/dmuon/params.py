"""What DMuon knows of each parameter (its name, how Muon sees it as matrices, why it was
routed where it is), followed through replaced parameter objects.

Frameworks replace parameter objects and keep the module's structure: Accelerate's FSDP2
``prepare`` puts a fresh ``nn.Parameter`` into the module and into ``param_groups``; so do
``fully_shard`` after the optimizer is made, ``to_empty`` from the meta device and
``load_state_dict(..., assign=True)`` once their caller re-points ``param_groups`` at the
module's new parameters (as for any torch optimizer). The registry keeps each entry by
its place in ``param_groups`` (group and position, by name where the group carries
``param_names``). When the groups hold other objects than it saw (the ids of their params
lists, compared once per step), it hands each entry, and the optimizer state, to the object
now in that place; one whose shape does not fit the entry raises naming it.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import torch

from dmuon.routing import MatrixView, default_batch_dims, route_params
from dmuon.split_options import split_view

MUON_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    """The C++ runtime's name of a dtype ("float32", "bfloat16"…)."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    name: str
    view: MatrixView | None  # Muon's view of the parameter (None: an AdamW parameter)
    reason: str | None  # why routing chose its side (None: the group's use_muon)
    shape: tuple[int, ...]  # global shape, what a replacement must keep


def validate_param(name: str, param: Any, use_muon: bool | None) -> None:
    """`use_muon` None: only what every parameter needs."""
    if not isinstance(param, torch.Tensor):
        raise TypeError(f"parameter {name!r} is a {type(param).__name__}, not a tensor")
    if not param.is_floating_point():
        raise TypeError(f"parameter {name!r} has dtype {param.dtype}; DMuon optimizes floating-point parameters")
    if use_muon:
        if param.dim() < 2:
            raise ValueError(f"parameter {name!r} of shape {tuple(param.shape)} was put in a Muon group, "
                             "but Muon needs a matrix (ndim >= 2); put it in a use_muon=False group")
        if param.dtype not in MUON_DTYPES:
            raise TypeError(f"parameter {name!r} has dtype {param.dtype}; Muon supports {[str(d) for d in MUON_DTYPES]}")


def _params_ids(param_groups: list[dict[str, Any]]) -> list[list[int]]:
    # NOTE: 17 µs for 500 parameters (a tuple of them all from one generator: 32 µs).
    return [list(map(id, group["params"])) for group in param_groups]


class ParamRegistry:
    """Each param group's entries (ParamInfo) in the order of its params, and an index by the
    objects now in those places."""

    def __init__(self) -> None:
        self._groups: list[list[ParamInfo]] = []
        self._refs: list[list[weakref.ref]] = []  # the objects seen (weak: a replaced one may go)
        self._by_id: dict[int, ParamInfo] = {}
        self._seen: list[list[int]] = []  # ids of each group's params seen

    def add_group(self, params: list[torch.Tensor], infos: list[ParamInfo]) -> None:
        self._groups.append(list(infos))
        self._refs.append([weakref.ref(p) for p in params])
        self._by_id.update((id(p), info) for p, info in zip(params, infos))
        self._seen.append([id(p) for p in params])

    def info(self, param: torch.Tensor) -> ParamInfo | None:
        return self._by_id.get(id(param))

    def view(self, param: torch.Tensor) -> MatrixView:
        """Muon's view of `param` as routed (unsplit); a parameter routed to AdamW or unknown:
        its shape's default."""
        info = self._by_id.get(id(param))
        return info.view if info is not None and info.view is not None else \
            MatrixView(batch_dims=default_batch_dims(param))

    def batch_dims(self, param: torch.Tensor) -> int:
        """1 for a Muon parameter seen as a stack of matrices, else 0 (AdamW parameters too)."""
        info = self._by_id.get(id(param))
        return info.view.batch_dims if info is not None and info.view is not None else 0

    def set_view(self, param: torch.Tensor, view: MatrixView) -> None:
        """Replace the routed view of `param` (tests and tools that set a view by hand)."""
        for entries, refs in zip(self._groups, self._refs):
            for i, ref in enumerate(refs):
                if ref() is param:
                    entries[i] = self._by_id[id(param)] = dataclasses.replace(entries[i], view=view)
                    return
        raise KeyError(f"parameter {id(param)} is not in this optimizer")

    def follow(self, param_groups: list[dict[str, Any]], state: dict) -> bool:
        """Hands the entries (and `state`'s) to the objects now in their places; False when
        the groups hold the objects seen. Raises naming a place whose object does not fit."""
        if _params_ids(param_groups) == self._seen:
            return False
        if len(param_groups) != len(self._groups):
            raise ValueError(f"param_groups holds {len(param_groups)} groups, but DMuon was given {len(self._groups)}; "
                             "add a group with add_param_group")
        by_id: dict[int, ParamInfo] = {}
        for g_idx, (group, entries, refs) in enumerate(zip(param_groups, self._groups, self._refs)):
            params = group["params"]
            if len(params) != len(entries):
                raise ValueError(f"param group {g_idx} holds {len(params)} parameters, but DMuon was given "
                                 f"{len(entries)} ({entries[0].name!r}…); replace parameters one for one, or build a "
                                 "new DMuon")
            order = self._order_by_names(group, entries)
            if order is not None:
                entries[:] = [entries[i] for i in order]
                refs[:] = [refs[i] for i in order]
            for idx, (p, info, ref) in enumerate(zip(params, entries, refs)):
                if not isinstance(p, torch.Tensor) or tuple(p.shape) != info.shape:
                    shape = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
                    raise ValueError(f"param_groups[{g_idx}]['params'][{idx}] is now {shape}, but DMuon knows that place "
                                     f"as parameter {info.name!r} of shape {info.shape}: a replaced parameter must "
                                     "keep its place and shape (or build a new DMuon)")
                old = ref()
                if old is not None and old is not p and old in state and p not in state:
                    state[p] = state.pop(old)
                by_id[id(p)] = info
            refs[:] = [weakref.ref(p) for p in params]
        self._by_id, self._seen = by_id, _params_ids(param_groups)
        return True

    @staticmethod
    def _order_by_names(group: dict[str, Any], entries: list[ParamInfo]) -> list[int] | None:
        """Where the group's `param_names` name every entry once: the entries' order of them."""
        names = group.get("param_names")
        index = {info.name: i for i, info in enumerate(entries)}
        if not isinstance(names, (list, tuple)) or len(names) != len(entries) or len(index) != len(entries):
            return None
        if sorted(map(str, names)) != sorted(index):
            return None
        return [index[name] for name in names]


def split_error(param_groups: list[dict[str, Any]], registry: ParamRegistry, name_of: Callable[[Any], str],
                owned: Callable[[Any], bool]) -> str:
    """Why a Muon group's split does not fit one of its parameters ("" if every one fits)."""
    for g_idx, group in enumerate(param_groups):
        if not group["use_muon"] or (group.get("split_rows") is None and group.get("split_heads") is None):
            continue
        for p in group["params"]:
            if owned(p):
                return (f"param group {g_idx}: split_rows/split_heads for parameter {name_of(p)!r}, which "
                        "own_matrices owns: the weight-ownership mode does not split matrices")
            try:
                split_view(registry.view(p), p, group, name_of(p), f"param group {g_idx}: ")
            except ValueError as error:
                return str(error)
    return ""


def route_group(params: Any, group_idx: int, known: Callable[[torch.Tensor], ParamInfo | None],
                use_muon: bool | None) -> tuple[list[torch.Tensor], list[ParamInfo], bool]:
    """The tensors of param group `group_idx`'s `params` (tensors or (name, tensor) pairs),
    their entries and the group's side. Names and views come from `known` (the routing
    made at construction), else from these entries; `use_muon` None: routed here, and the
    group must be all Muon or all AdamW. Raises naming a parameter that does not fit."""
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    names, tensors, entries = [], [], []
    for idx, item in enumerate(params):
        name, param = item if isinstance(item, tuple) else (None, item)
        info = known(param) if isinstance(param, torch.Tensor) else None
        name = name or (info.name if info is not None else None)
        entries.append(param if name is None else (name, param))
        names.append(name or f"param_groups[{group_idx}].params[{idx}]")
        tensors.append(param)
    for name, param in zip(names, tensors):
        validate_param(name, param, None)
    routed = {id(r.param): r for r in route_params(entries, prefix=f"param_groups[{group_idx}].params", warn=False)}
    if use_muon is None:
        kinds = {id(p): routed[id(p)].use_muon for p in tensors}
        if len(set(kinds.values())) > 1:
            muon = next(n for n, p in zip(names, tensors) if kinds[id(p)])
            other = next(n for n, p in zip(names, tensors) if not kinds[id(p)])
            raise ValueError(f"param group {group_idx} mixes Muon parameters ({muon!r}) and AdamW ones "
                             f"({other!r}); set use_muon=True or False, or pass two groups")
        use_muon = next(iter(kinds.values())) if kinds else True
    infos = []
    for name, param in zip(names, tensors):
        validate_param(name, param, use_muon)
        info, r = known(param), routed[id(param)]
        view = None
        if use_muon:
            view = info.view if info is not None and info.view is not None else \
                r.view if r.use_muon else MatrixView(batch_dims=default_batch_dims(param))
        infos.append(ParamInfo(name=name, view=view, reason=info.reason if info is not None else None,
                               shape=tuple(param.shape)))
    return tensors, infos, use_muon
