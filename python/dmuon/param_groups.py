"""DMuon's param groups from what a user passes: a module, ``named_parameters()`` (or any
``(name, tensor)`` pairs), bare tensors, or param-group dicts.

A group dict with ``use_muon`` is taken as it is. One without it is routed like a list
(by names when its entries are ``(name, tensor)`` pairs, else by shape, where matrices and
vectors in one group are an error) and split into its Muon part and its AdamW part, in that
order, each with the group's options: ``lr``,
``weight_decay`` and ``initial_lr`` go to both parts, Muon's options (``momentum``,
``nesterov``, ``ns_*``, ``adjust_lr``) to the Muon part, ``betas`` and ``eps`` to the AdamW
part (a torch user's ``eps`` is AdamW's). So the usual decay/no-decay groups of nanoGPT or
HF keep their weight decay on both sides.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

from dmuon.group_options import ADAMW_KEYS, EXTRA_KEYS, MUON_KEYS
from dmuon.routing import RoutedParam, route_module, route_params, warn_unnamed_matrices

_SHARED_KEYS = {"lr", "weight_decay", "initial_lr"}
_MUON_ONLY = set(MUON_KEYS) - _SHARED_KEYS
_ADAMW_ONLY = {"betas", "eps"}


@dataclasses.dataclass
class InitialGroups:
    groups: list[dict[str, Any]]
    routes: dict[int, RoutedParam]  # id(param) → its routing (names, views, reasons)


def initial_groups(params: Any, muon_filter: Callable[[str, nn.Parameter], bool] | None) -> InitialGroups:
    """Param groups (dicts with ``use_muon``) and the routing of every parameter routed here."""
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
        return _from_group_dicts(items)
    routed = route_params(items, prefix="params", warn=False)
    warn_unnamed_matrices([r for r in routed if r.unnamed and r.use_muon])
    return _from_routed(routed)


def _from_routed(routed: list[RoutedParam]) -> InitialGroups:
    groups = []
    for use_muon in (True, False):
        chosen = [r.param for r in routed if r.use_muon == use_muon]
        if chosen:
            groups.append({"params": chosen, "use_muon": use_muon})
    if not groups:
        raise ValueError("DMuon found no parameters")
    return InitialGroups(groups=groups, routes={id(r.param): r for r in routed})


def _from_group_dicts(items: list[dict[str, Any]]) -> InitialGroups:
    groups: list[dict[str, Any]] = []
    routes: dict[int, RoutedParam] = {}
    unnamed: list[RoutedParam] = []
    for g_idx, item in enumerate(items):
        if "params" not in item:
            raise ValueError(f"param group {g_idx} has no 'params'")
        if "use_muon" in item:
            groups.append(dict(item))
            continue
        unknown = sorted(set(item) - set(MUON_KEYS) - set(ADAMW_KEYS) - set(EXTRA_KEYS))
        if unknown:
            raise ValueError(f"param group {g_idx} has unknown option(s) {unknown}; allowed: "
                             f"{sorted((set(MUON_KEYS) | set(ADAMW_KEYS) | set(EXTRA_KEYS)) - {'params'})}")
        entries = item["params"]
        entries = [entries] if isinstance(entries, torch.Tensor) else list(entries)
        routed = route_params(entries, prefix=f"param_groups[{g_idx}].params", warn=False)
        if len({r.use_muon for r in routed}) > 1 and any(r.unnamed for r in routed):
            raise ValueError(f"param group {g_idx} mixes matrices and vectors without names; set use_muon=True or "
                             "False, or pass (name, tensor) pairs (named_parameters()) so DMuon can route them")
        unnamed += [r for r in routed if r.unnamed and r.use_muon]
        options = {k: v for k, v in item.items() if k != "params"}
        for use_muon, only in ((True, _MUON_ONLY), (False, _ADAMW_ONLY)):
            part = [r for r in routed if r.use_muon == use_muon]
            if not part:
                continue
            for r in part:
                routes[id(r.param)] = r
            kept = {k: v for k, v in options.items() if k in _SHARED_KEYS or k in only or k in EXTRA_KEYS}
            params = [(r.name, r.param) if not r.unnamed else r.param for r in part]
            groups.append({**kept, "params": params, "use_muon": use_muon})
    warn_unnamed_matrices(unnamed)
    return InitialGroups(groups=groups, routes=routes)
