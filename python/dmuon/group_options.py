"""The options of DMuon's param groups: their keys, their checks (errors name the option
and the group), and the AdamW group that keeps ``momentum`` and ``betas[0]`` one value.

Checks run at construction, in ``add_param_group``, on a checkpoint's groups before it is
loaded and at every step (a scheduler or the user may have changed a group since).
"""

from __future__ import annotations

import math
from typing import Any

from dmuon.split_options import SPLIT_DEFAULTS, check_split_options

NS_ALGORITHMS = ("gram", "standard")
ADJUST_LR = (None, "original", "match_rms_adamw", "spectral")
# The math of a Muon group (the fields of dmuon.MuonMath, under the same names).
MATH_KEYS = ("momentum", "nesterov", "ns_algorithm", "ns_coefficients", "ns_steps", "ns_restarts", "eps", "adjust_lr",
             "normuon", "normuon_beta2", "normuon_eps")
# NOTE: defaults of the keys added after checkpoints were written (a group saved without
# them reads these).
MATH_DEFAULTS = {"normuon": False, "normuon_beta2": 0.95, "normuon_eps": 1e-8}
# Split orthogonalization (dmuon.split_options): row or column blocks per parameter of the group.
SPLIT_KEYS = tuple(SPLIT_DEFAULTS)
MUON_KEYS = ("lr", "weight_decay", *MATH_KEYS, *SPLIT_KEYS)
# NOTE: a user gives an AdamW group `betas`; DMuon's group also carries `momentum` = betas[0]
# (AdamWGroup) for the schedulers that cycle it.
ADAMW_KEYS = ("lr", "weight_decay", "betas", "eps")
# Bookkeeping kept in every group: steps taken (including skipped ones) and skipped steps.
COUNTER_KEYS = ("num_steps", "num_skipped_steps")
# What torch's schedulers and DMuon itself add to groups.
EXTRA_KEYS = ("params", "use_muon", "initial_lr", *COUNTER_KEYS)
# torch.optim's own group keys, taken by groups of either kind: ``param_names`` (recorded as
# torch.optim records it when built from (name, tensor) pairs; torchtitan's checkpoint keys
# the state by it) and the implementation switches ``fused`` and ``foreach`` (torchtitan
# passes them to every optimizer). NOTE: the switches are kept in the group and change
# nothing: the Muon part runs on the step engine, and the AdamW part picks torch's fused
# kernel on one CUDA device and its foreach passes elsewhere by itself.
TORCH_KEYS = ("param_names", "fused", "foreach")
# Keys a group that DMuon splits (no ``use_muon``) or an AdamW group may carry for its AdamW
# part, named as DMuon's keywords: the AdamW part's key each one sets.
ADAMW_GROUP_KEYS = {"adamw_lr": "lr", "adamw_weight_decay": "weight_decay"}

# The DMuon keyword that sets each AdamW group key (for errors at construction).
ADAMW_OPTION_NAMES = {"lr": "adamw_lr", "weight_decay": "adamw_weight_decay", "betas": "adamw_betas",
                      "eps": "adamw_eps", "momentum": "adamw_betas"}


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_nonnegative(where: str, name: str, value: Any) -> None:
    if not (is_number(value) and value >= 0):
        raise ValueError(f"{where}{name} must be a finite number >= 0, got {value!r}")


def check_muon_group(group: dict[str, Any], where: str, names: dict[str, str] | None = None) -> None:
    """Raise ValueError naming the first bad option of a Muon group; normalizes
    ``ns_coefficients`` to one (a, b, c) per step. `names`: the option name to print per key."""
    names = names or {}
    for key in ("lr", "weight_decay"):
        _check_nonnegative(where, names.get(key, key), group[key])
    check_muon_math(group, where, names)
    check_split_options(group, where)


def check_muon_math(group: dict[str, Any], where: str, names: dict[str, str] | None = None) -> None:
    """The MATH_KEYS part of check_muon_group (also dmuon.MuonMath's check). A group saved
    before ``ns_restarts`` existed has none: the algorithm's default."""
    names = names or {}
    name = lambda key: names.get(key, key)  # noqa: E731
    if group["ns_algorithm"] not in NS_ALGORITHMS:
        raise ValueError(f"{where}{name('ns_algorithm')} must be one of {NS_ALGORITHMS}, got {group['ns_algorithm']!r}")
    if group["adjust_lr"] not in ADJUST_LR:
        raise ValueError(f"{where}{name('adjust_lr')} must be one of {ADJUST_LR}, got {group['adjust_lr']!r}")
    steps = group["ns_steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 100:
        raise ValueError(f"{where}{name('ns_steps')} must be an integer in 1..100, got {steps!r}")
    if group["ns_coefficients"] is not None:
        group["ns_coefficients"] = _coefficients(group["ns_coefficients"], steps, where + name("ns_coefficients"))
    if group.get("ns_restarts") is not None:
        group["ns_restarts"] = _restarts(group["ns_restarts"], group["ns_algorithm"], steps,
                                         where + name("ns_restarts"))
    _check_nonnegative(where, name("eps"), group["eps"])
    if group["eps"] <= 0:
        raise ValueError(f"{where}{name('eps')} must be > 0, got {group['eps']!r}")
    if not (is_number(group["momentum"]) and 0.0 <= group["momentum"] < 1.0):
        raise ValueError(f"{where}{name('momentum')} must be a number in [0, 1), got {group['momentum']!r}")
    if not isinstance(group["nesterov"], bool):
        raise ValueError(f"{where}{name('nesterov')} must be True or False, got {group['nesterov']!r}")
    check_normuon(group, where, name)


def check_normuon(group: dict[str, Any], where: str, name: Any = lambda key: key) -> None:
    """NorMuon's options (Li et al., 2025): a bool switch, beta2 in [0, 1), eps > 0."""
    enabled = group.get("normuon", MATH_DEFAULTS["normuon"])
    if not isinstance(enabled, bool):
        raise ValueError(f"{where}{name('normuon')} must be True or False, got {enabled!r}")
    beta2 = group.get("normuon_beta2", MATH_DEFAULTS["normuon_beta2"])
    if not (is_number(beta2) and 0.0 <= beta2 < 1.0):
        raise ValueError(f"{where}{name('normuon_beta2')} must be a number in [0, 1), got {beta2!r}")
    eps = group.get("normuon_eps", MATH_DEFAULTS["normuon_eps"])
    if not (is_number(eps) and eps > 0):
        raise ValueError(f"{where}{name('normuon_eps')} must be a finite number > 0, got {eps!r}")


def _coefficients(value: Any, steps: int, what: str) -> list[tuple[float, float, float]]:
    """One (a, b, c) per step from one triple (every step, as torch.optim.Muon) or `steps` triples."""
    try:
        coefficients = [tuple(float(x) for x in step) for step in value]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be one (a, b, c) triple or ns_steps={steps} triples, got {value!r}") from None
    if len(coefficients) == 1 and steps > 1:
        coefficients = coefficients * steps
    if len(coefficients) != steps or any(len(c) != 3 for c in coefficients):
        raise ValueError(f"{what} must be one (a, b, c) triple or ns_steps={steps} triples, got {value!r}")
    if not all(math.isfinite(x) for c in coefficients for x in c):
        raise ValueError(f"{what} must be finite, got {coefficients}")
    return coefficients


def _restarts(value: Any, algorithm: str, steps: int, what: str) -> list[int]:
    """Strictly increasing 1-based iterations in 1..steps (Gram only; [] means none)."""
    try:
        restarts = list(value)
    except TypeError:
        raise ValueError(f"{what} must be None or a sequence of iterations, got {value!r}") from None
    if not all(isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= steps for r in restarts) or \
            any(a >= b for a, b in zip(restarts, restarts[1:])):
        raise ValueError(f"{what} must be strictly increasing iterations in 1..ns_steps={steps}, got {value!r}")
    if restarts and algorithm != "gram":
        raise ValueError(f"{what} restarts only the 'gram' iteration, but ns_algorithm is {algorithm!r}")
    return restarts


def check_adamw_group(group: dict[str, Any], where: str, names: dict[str, str] | None = None) -> None:
    """Raise ValueError naming the first bad option of an AdamW group."""
    names = names or {}
    betas = group["betas"]
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(is_number(b) and 0.0 <= b < 1.0
                                                                          for b in betas)):
        raise ValueError(f"{where}{names.get('betas', 'betas')} must be a pair (beta1, beta2) of numbers in [0, 1), "
                         f"got {betas!r}")
    if "momentum" in group and group["momentum"] != betas[0]:
        raise ValueError(f"{where}momentum ({group['momentum']!r}) is beta1 in an AdamW group, but betas is "
                         f"{betas!r}; set one of them")
    for key in ("lr", "weight_decay", "eps"):
        _check_nonnegative(where, names.get(key, key), group[key])


def check_unknown_keys(group: dict[str, Any], group_idx: int, use_muon: bool) -> None:
    """Options a group of this kind does not take (typos, the other kind's options), and
    torch's implementation switches that are not None or a bool."""
    allowed = set(MUON_KEYS if use_muon else ADAMW_KEYS) | set(EXTRA_KEYS) | set(TORCH_KEYS)
    unknown = sorted(set(group) - allowed)
    if unknown:
        kind = "Muon" if use_muon else "AdamW"
        hint = " (AdamW's momentum is betas[0])" if not use_muon and "momentum" in unknown else ""
        if use_muon and "split_cols" in unknown:
            hint = " (column blocks, e.g. o_proj per head: split_heads=n with split_dim=1)"
        if use_muon and set(unknown) & set(ADAMW_GROUP_KEYS):
            hint = (" (a use_muon=True group has no AdamW part; set adamw_* in a group DMuon routes, one without "
                    "use_muon, or lr in a use_muon=False group)")
        raise ValueError(f"param group {group_idx} ({kind}) has unknown option(s) {unknown}; allowed: "
                         f"{sorted(allowed - {'params'})}{hint}")
    for key in ("fused", "foreach"):
        if group.get(key) is not None and not isinstance(group[key], bool):
            raise ValueError(f"param group {group_idx}: {key} must be None, True or False (torch's implementation "
                             f"switch; it changes nothing in DMuon), got {group[key]!r}")


class AdamWGroup(dict):
    """An AdamW param group in which ``momentum`` is β1: setting either ``momentum`` or
    ``betas`` sets the other. So schedulers that cycle ``momentum`` in every group (torch's
    OneCycleLR and CyclicLR, which read ``optimizer.defaults``) drive AdamW's β1 as they
    drive Muon's momentum, and the step uses what they set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        # NOTE: a malformed value is stored as given; the next step's check names it.
        if key == "momentum" and _pair(self.get("betas")):
            super().__setitem__("betas", (value, self["betas"][1]))
        elif key == "betas" and _pair(value):
            super().__setitem__("momentum", value[0])

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        items = dict(*args, **kwargs)
        # NOTE: betas first, so that a momentum given with it wins only when it differs.
        for key in sorted(items, key=lambda k: k != "betas"):
            self[key] = items[key]

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __deepcopy__(self, memo: dict) -> "AdamWGroup":
        import copy

        return AdamWGroup({k: copy.deepcopy(v, memo) for k, v in self.items()})


def _pair(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2


def as_adamw_group(group: dict[str, Any], where: str) -> AdamWGroup:
    """`group` (with `betas`) as an AdamWGroup; a `momentum` that is not betas[0] is an error."""
    if "momentum" in group and _pair(group.get("betas")) and group["momentum"] != group["betas"][0]:
        raise ValueError(f"{where}momentum ({group['momentum']!r}) is beta1 in an AdamW group, but betas is "
                         f"{group['betas']!r}; set one of them")
    return AdamWGroup({k: v for k, v in group.items() if k != "momentum"})


def group_signature_options(group: dict[str, Any]) -> tuple:
    """The group's options as a comparable tuple (for rank agreement)."""
    return tuple(sorted((k, repr(v)) for k, v in group.items() if k not in ("params", *COUNTER_KEYS)))
