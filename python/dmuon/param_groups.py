"""DMuon's param groups from what a user passes: a module, ``named_parameters()`` (or any
``(name, tensor)`` pairs), bare tensors, or param-group dicts.

A group dict with ``use_muon`` is taken as it is. One without it is routed like a list
(by names when its entries are ``(name, tensor)`` pairs or it carries ``param_names``, else
by shape, where matrices and vectors in one group are an error) and split into its Muon part
and its AdamW part, in that order, each with the group's options: ``lr``,
``weight_decay`` and ``initial_lr`` go to both parts, Muon's options (``momentum``,
``nesterov``, ``ns_*``, ``adjust_lr``) to the Muon part, ``betas`` and ``eps`` to the AdamW
part (a torch user's ``eps`` is AdamW's). So the usual decay/no-decay groups of nanoGPT or
HF keep their weight decay on both sides.

The AdamW part's lr and weight decay, first given first: the group's ``adamw_lr`` /
``adamw_weight_decay``; DMuon's ``adamw_lr=`` / ``adamw_weight_decay=``; the group's ``lr`` /
``weight_decay``. So an ``adamw_lr`` a user sets is what AdamW gets, also where a framework
puts an ``lr`` in every group (torchtitan does). In a ``use_muon=False`` group ``adamw_lr``
is its ``lr``: both, with different values, are an error; in a ``use_muon=True`` group it is
an error.

torch.optim's group contract: ``param_names`` is taken as input (the names of ``params``, in
order) and recorded in every group, and so in ``state_dict()``, when every parameter has a
name (DMuon built from a module, ``named_parameters()``, ``(name, tensor)`` pairs or
``param_names``); as in torch.optim, groups with names and groups without are not mixed.
``fused`` and ``foreach`` are kept and change nothing (dmuon.group_options.TORCH_KEYS).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

from dmuon.group_options import ADAMW_GROUP_KEYS, ADAMW_KEYS, EXTRA_KEYS, MUON_KEYS, TORCH_KEYS
from dmuon.routing import RoutedParam, route_module, route_params, warn_unnamed_matrices

_SHARED_KEYS = {"lr", "weight_decay", "initial_lr"}
_MUON_ONLY = set(MUON_KEYS) - _SHARED_KEYS
_ADAMW_ONLY = {"betas", "eps"}
_GROUP_KEYS = set(MUON_KEYS) | set(ADAMW_KEYS) | set(EXTRA_KEYS) | set(TORCH_KEYS) | set(ADAMW_GROUP_KEYS)


def named_entries(group: dict[str, Any], group_idx: int) -> tuple[list[Any], bool]:
    """The group's ``params`` with its ``param_names`` as (name, tensor) pairs, and whether
    every parameter has a name given (a pair, or param_names): the group records them."""
    params = group["params"]
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    given = group.get("param_names")
    if given is None:
        return params, all(isinstance(item, tuple) for item in params)
    if isinstance(given, str) or len(list(given)) != len(params) or not all(isinstance(n, str) for n in given):
        raise ValueError(f"param group {group_idx}: param_names must be one name (str) per parameter of 'params' "
                         f"({len(params)}), got {given!r}")
    entries = []
    for idx, (item, name) in enumerate(zip(params, given)):
        if isinstance(item, tuple):
            if item[0] != name:
                raise ValueError(f"param group {group_idx}: parameter {idx} is named {item[0]!r} in 'params' but "
                                 f"{name!r} in param_names")
            item = item[1]
        entries.append((name, item))
    return entries, True


def check_names_recorded(param_groups: list[dict[str, Any]], named: bool, group_idx: int, entries: list[Any]) -> None:
    """torch.optim's rule, with the parameter named: groups with param_names and groups
    without are not mixed."""
    if param_groups and ("param_names" in param_groups[0]) != named:
        unnamed = next((i for i, e in enumerate(entries) if not isinstance(e, tuple)), 0)
        raise ValueError(f"param group {group_idx}: " + (
            f"parameter 'param_groups[{group_idx}].params[{unnamed}]' has no name, but this optimizer's groups record "
            "param_names (it was built from names); pass (name, tensor) pairs or param_names" if not named else
            "its parameters have names, but this optimizer's groups record none (it was built from bare tensors); "
            "pass bare tensors, as torch.optim requires"))


def resolve_adamw_keys(group: dict[str, Any], group_idx: int) -> None:
    """A use_muon=False group's ``adamw_lr`` / ``adamw_weight_decay`` as its ``lr`` /
    ``weight_decay`` (in place); both with different values: ValueError naming them."""
    if group.get("use_muon", True):
        return  # NOTE: a Muon group's adamw_* is refused as an unknown option, with a hint
    for key, target in ADAMW_GROUP_KEYS.items():
        if key not in group:
            continue
        value = group.pop(key)
        if target in group and group[target] != value:
            raise ValueError(f"param group {group_idx} (AdamW) sets {target}={group[target]!r} and {key}={value!r}; "
                             f"in a use_muon=False group both are AdamW's {target}: set one")
        group[target] = value


@dataclasses.dataclass
class InitialGroups:
    groups: list[dict[str, Any]]
    routes: dict[int, RoutedParam]  # id(param) → its routing (names, views, reasons)


def initial_groups(params: Any, muon_filter: Callable[[str, nn.Parameter], bool] | None,
                   adamw: dict[str, Any] | None = None) -> InitialGroups:
    """Param groups (dicts with ``use_muon``) and the routing of every parameter routed here.
    `adamw`: DMuon's ``adamw_lr`` and ``adamw_weight_decay`` as ``lr`` and ``weight_decay``
    (None: not given), for the AdamW part of the groups routed here."""
    if isinstance(params, nn.Module):
        return _from_routed(route_module(params, muon_filter))
    if muon_filter is not None:
        raise ValueError("muon_filter is only used when params is an nn.Module")
    if isinstance(params, torch.Tensor):
        params = [params]
    items = list(params)
    if not items:
        raise ValueError("DMuon got an empty parameter list")
    if any(isinstance(item, dict) for item in items):
        if not all(isinstance(item, dict) for item in items):
            raise TypeError("params mixes param-group dicts with tensors")
        return _from_group_dicts(items, {k: v for k, v in (adamw or {}).items() if v is not None})
    routed = route_params(items, prefix="params", warn=False)
    warn_unnamed_matrices([r for r in routed if r.unnamed and r.use_muon])
    return _from_routed(routed)


def _from_routed(routed: list[RoutedParam]) -> InitialGroups:
    groups = []
    for use_muon in (True, False):
        chosen = [r.param if r.unnamed else (r.name, r.param) for r in routed if r.use_muon == use_muon]
        if chosen:
            groups.append({"params": chosen, "use_muon": use_muon})
    if not groups:
        raise ValueError("DMuon found no parameters")
    return InitialGroups(groups=groups, routes={id(r.param): r for r in routed})


def _from_group_dicts(items: list[dict[str, Any]], adamw: dict[str, Any]) -> InitialGroups:
    groups: list[dict[str, Any]] = []
    routes: dict[int, RoutedParam] = {}
    unnamed: list[RoutedParam] = []
    for g_idx, item in enumerate(items):
        if "params" not in item:
            raise ValueError(f"param group {g_idx} has no 'params'")
        if "use_muon" in item:
            groups.append(dict(item))
            continue
        unknown = sorted(set(item) - _GROUP_KEYS)
        if unknown:
            raise ValueError(f"param group {g_idx} has unknown option(s) {unknown}; allowed: "
                             f"{sorted(_GROUP_KEYS - {'params'})}")
        entries, _ = named_entries(item, g_idx)
        routed = route_params(entries, prefix=f"param_groups[{g_idx}].params", warn=False)
        if len({r.use_muon for r in routed}) > 1 and any(r.unnamed for r in routed):
            raise ValueError(f"param group {g_idx} mixes matrices and vectors without names; set use_muon=True or "
                             "False, or pass (name, tensor) pairs (named_parameters()) so DMuon can route them")
        unnamed += [r for r in routed if r.unnamed and r.use_muon]
        options = {k: v for k, v in item.items() if k not in ("params", "param_names")}
        # The AdamW part's lr and weight decay: the group's adamw_*, DMuon's, the group's.
        adamw_part = {**{k: options[k] for k in ("lr", "weight_decay") if k in options}, **adamw,
                      **{target: options[key] for key, target in ADAMW_GROUP_KEYS.items() if key in options}}
        for use_muon, only in ((True, _MUON_ONLY), (False, _ADAMW_ONLY)):
            part = [r for r in routed if r.use_muon == use_muon]
            if not part:
                continue
            for r in part:
                routes[id(r.param)] = r
            kept = {k: v for k, v in options.items() if k in _SHARED_KEYS or k in only or k in EXTRA_KEYS
                    or k in TORCH_KEYS}
            if not use_muon:
                kept.update(adamw_part)
            params = [(r.name, r.param) if not r.unnamed else r.param for r in part]
            groups.append({**kept, "params": params, "use_muon": use_muon})
    warn_unnamed_matrices(unnamed)
    return InitialGroups(groups=groups, routes=routes)
