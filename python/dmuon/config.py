"""DMuon's typed options: the Muon math (:class:`MuonMath`), how the step runs
(:class:`Execution`) and the weight-ownership mode (:class:`Ownership`)::

    opt = dmuon.DMuon(model, lr=0.02, math=dmuon.MuonMath(ns_algorithm="standard", ns_steps=5),
                      execution=dmuon.Execution(bucket_size_mb=32, planner="lpt"))

Each is a frozen keyword-only dataclass, checked when it is made (an error names the class
and the field). DMuon's flat keyword arguments of earlier releases (``momentum=…``,
``bucket_size_mb=…``; :data:`FLAT_OPTIONS` maps each onto its field) are deprecated: each
still sets its field, with one DeprecationWarning per alias and process naming the field to
use; a flat value that differs from the dataclass given with it is an error naming both.
Param groups may override any :class:`MuonMath` field under the same key
(``{"params": …, "ns_steps": 7}``).

The ``None`` fields of :class:`Execution` are the code-path switches left to their default: the
``DMUON_*`` variable named in the field's comment overrides them when set, read when the
step runtime is made (docs/configuration.md lists every field, default and variable).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Iterator, Mapping

import torch

from dmuon.group_options import MATH_KEYS, check_muon_math, is_int, is_number

NONFINITE = ("raise", "skip")
MODES = ("owner", "gather")
WIRE_DTYPES = ("auto", "float32", "bfloat16", "float16")
PLANNERS = ("milp", "lpt", "round_robin")
COST_MODELS = ("auto", "analytic", "profile")
REDUCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fail(cls: type, name: str, requirement: str, value: Any) -> None:
    raise ValueError(f"{cls.__name__}.{name} must be {requirement}, got {value!r}")


def _check_choice(obj: Any, name: str, allowed: tuple) -> None:
    if getattr(obj, name) not in allowed:
        _fail(type(obj), name, f"one of {allowed}", getattr(obj, name))


def _check_optional_bool(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    if value is not None and not isinstance(value, bool):
        _fail(type(obj), name, "True, False or None (the DMUON_* override or the default)", value)


def _check_optional_int(obj: Any, name: str, low: int, high: int | None = None) -> None:
    value = getattr(obj, name)
    if value is None:
        return
    if not (is_int(value) and value >= low and (high is None or value <= high)):
        span = f">= {low}" if high is None else f"in {low}..{high}"
        _fail(type(obj), name, f"None or an integer {span}", value)


class _Options:
    """What the three option classes share: a dict of their fields, and `replace`."""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> Any:
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MuonMath(_Options):
    """What a Muon step computes (the defaults of every Muon param group; a group may set any
    of these keys itself). ``ns_coefficients``: one (a, b, c) for every step or ``ns_steps``
    triples (None: Polar Express ÷ 1.05 for "gram", Keller Jordan's for "standard");
    ``ns_restarts``: the 1-based Gram iterations after which the iteration restarts (None:
    the algorithm's default, after 2 for "gram"; "standard" has none); ``eps``: the
    normalization floor; ``adjust_lr``: None (ratio 1), "original" (√max(1, m/n)),
    "match_rms_adamw" (0.2·√max(m, n)) or "spectral" (√(m/n)). ``normuon``: NorMuon's row
    normalization of the orthogonalized update (Li et al., 2025: a per-row second moment
    with ``normuon_beta2``, rows divided by √v + ``normuon_eps``, the norm kept; one float32
    state vector per matrix row, ``normuon_v``); off by default."""

    momentum: float = 0.95
    nesterov: bool = True
    ns_algorithm: str = "gram"
    ns_steps: int = 5
    ns_coefficients: tuple[tuple[float, float, float], ...] | None = None
    ns_restarts: tuple[int, ...] | None = None
    eps: float = 1e-7
    adjust_lr: str | None = "match_rms_adamw"
    normuon: bool = False
    normuon_beta2: float = 0.95
    normuon_eps: float = 1e-8

    def __post_init__(self) -> None:
        options = self.as_dict()
        check_muon_math(options, "", names={k: f"MuonMath.{k}" for k in options})
        # NOTE: normalized (one triple per step, tuples) so that equal math compares equal.
        for key in ("ns_coefficients", "ns_restarts"):
            value = options[key]
            object.__setattr__(self, key, None if value is None else tuple(value))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Execution(_Options):
    """How the step runs; the update it computes does not depend on these (up to the wire
    dtype's rounding). ``mode``: "owner" (each matrix orthogonalized once, on its planned
    owner) or "gather" (every rank orthogonalizes every matrix: the baseline);
    ``bucket_size_mb``: wire MiB per pipeline bucket (0: one bucket); ``wire_dtype``;
    ``planner``; ``cost_model`` ("profile": the engine times each group's NS batches when it
    plans, on rank 0, kept in the autotune cache (DMUON_AUTOTUNE_CACHE) on GPUs; "analytic":
    FLOP counts; "auto": profile on GPUs); ``nonfinite``:
    "raise" or "skip" a step with a NaN/Inf gradient; ``profile``: synchronize between
    phases so that ``runtime.last_stats`` times are real; ``record_timeline``: record each
    stage's compute phases as device time (``runtime.last_stats.bucket_times``, no host
    synchronization; the fake-world projection reads them). Code-path switches (None: the
    variable if set, else the default in brackets): ``fused_streams`` (DMUON_FUSED_STREAMS [2]:
    CUDA streams one process spreads its NS batches over),
    ``pipeline_depth`` (DMUON_PIPELINE_DEPTH [0: twice the world size]), ``ns_batch_mb``
    (DMUON_NS_BATCH_MB [2048]), ``cuda_graphs`` (DMUON_CUDA_GRAPHS [on]).
    ``backward_step``: start the sharded step from backward (dmuon.backward_step; None: off,
    the measured default, docs/configuration.md)."""

    mode: str = "owner"
    bucket_size_mb: float = 64.0
    wire_dtype: str = "auto"
    planner: str = "milp"
    cost_model: str = "auto"
    nonfinite: str = "raise"
    profile: bool = False
    record_timeline: bool = False
    fused_streams: int | None = None
    pipeline_depth: int | None = None
    ns_batch_mb: int | None = None
    cuda_graphs: bool | None = None
    backward_step: bool | None = None
    # Deprecated, no effect (not a field): see _COST_CACHE_GONE.
    cost_cache: dataclasses.InitVar[Any] = None

    def __post_init__(self, cost_cache: Any) -> None:
        if cost_cache is not None:
            warn_deprecated("Execution.cost_cache", _COST_CACHE_GONE)
        for name, allowed in (("mode", MODES), ("wire_dtype", WIRE_DTYPES), ("planner", PLANNERS),
                              ("cost_model", COST_MODELS), ("nonfinite", NONFINITE)):
            _check_choice(self, name, allowed)
        if not (is_number(self.bucket_size_mb) and self.bucket_size_mb >= 0):
            _fail(Execution, "bucket_size_mb", "a finite number >= 0 (0: one bucket)", self.bucket_size_mb)
        for name in ("profile", "record_timeline"):
            if not isinstance(getattr(self, name), bool):
                _fail(Execution, name, "True or False", getattr(self, name))
        _check_optional_bool(self, "cuda_graphs")
        if self.backward_step is not None and not isinstance(self.backward_step, bool):
            _fail(Execution, "backward_step", "True, False or None (off)",
                  self.backward_step)
        _check_optional_int(self, "fused_streams", 1, 8)
        _check_optional_int(self, "pipeline_depth", 0)
        _check_optional_int(self, "ns_batch_mb", 1)

    def runtime_options(self) -> dict[str, Any]:
        """Keyword arguments of dmuon._C.engine.RuntimeOptions (None: the runtime resolves it)."""
        return dict(mode=self.mode, bucket_bytes=int(self.bucket_size_mb * 2**20), wire_dtype=self.wire_dtype,
                    solver=self.planner, cost_model=self.cost_model, profile=self.profile,
                    record_timeline=self.record_timeline, fused_streams=self.fused_streams,
                    pipeline_depth=self.pipeline_depth, ns_batch_mb=self.ns_batch_mb, cuda_graphs=self.cuda_graphs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ownership(_Options):
    """The weight-ownership mode (:func:`dmuon.own_matrices`): ``reshard_after_forward``
    frees non-owned weights after each module's forward; ``prefetch``: modules published
    ahead; ``bucket_size_mb``: MiB per gradient bucket (0: one bucket); ``reduce_dtype``:
    dtype of gradient buckets and their reduction; ``param_dtype``: dtype of the compute
    copies (None: the master's); ``planner``; ``spread_layers``: spread each layer's
    matrices over the owners; ``replicate_others``: plain data parallel for every other
    parameter."""

    reshard_after_forward: bool = True
    prefetch: int = 1
    bucket_size_mb: float = 25.0
    reduce_dtype: torch.dtype = torch.float32
    param_dtype: torch.dtype | None = None
    planner: str = "milp"
    spread_layers: bool = True
    replicate_others: bool = False

    def __post_init__(self) -> None:
        for name in ("reshard_after_forward", "spread_layers", "replicate_others"):
            if not isinstance(getattr(self, name), bool):
                _fail(Ownership, name, "True or False", getattr(self, name))
        if not (is_int(self.prefetch) and self.prefetch >= 0):
            _fail(Ownership, "prefetch", "an integer >= 0", self.prefetch)
        if not (is_number(self.bucket_size_mb) and self.bucket_size_mb >= 0):
            _fail(Ownership, "bucket_size_mb", "a finite number >= 0 (0: one bucket)", self.bucket_size_mb)
        if self.reduce_dtype not in REDUCE_DTYPES:
            _fail(Ownership, "reduce_dtype", f"one of {list(REDUCE_DTYPES)}", self.reduce_dtype)
        if self.param_dtype is not None and self.param_dtype not in REDUCE_DTYPES:
            _fail(Ownership, "param_dtype", f"None or one of {list(REDUCE_DTYPES)}", self.param_dtype)
        _check_choice(self, "planner", PLANNERS)


# The deprecated flat keywords of DMuon, each setting a dataclass field: name → (argument, field).
FLAT_OPTIONS: dict[str, tuple[str, str]] = {
    **{name: ("math", name) for name in MATH_KEYS},
    **{name: ("execution", name) for name in ("mode", "bucket_size_mb", "wire_dtype", "planner", "cost_model",
                                              "nonfinite")},
}
_COST_CACHE_GONE = ("cost_cache has no effect and will be removed: the measured NS costs live in the one "
                    "measurement store, the autotune cache (DMUON_AUTOTUNE_CACHE)")
_WARNED: set[str] = set()


def warn_deprecated(alias: str, message: str, stacklevel: int = 4) -> None:
    """One DeprecationWarning per alias and process."""
    if alias not in _WARNED:
        _WARNED.add(alias)
        warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)


def with_flat(cls: type, given: Any, arg: str, flat: Mapping[str, Any]) -> Any:
    """`given` (a `cls` or None: the defaults) with the flat keywords `flat` (field → value)
    applied. With a `given` object, a flat value that differs from its field raises
    ValueError naming both (the flat keyword and `arg`'s field)."""
    if given is not None and not isinstance(given, cls):
        raise TypeError(f"{arg} must be a dmuon.{cls.__name__} or None, got {type(given).__name__}")
    if given is None:
        return cls(**flat)
    for field, value in flat.items():
        # NOTE: compared normalized (MuonMath turns lists into tuples, one triple into ns_steps).
        if getattr(given.replace(**{field: value}), field) != getattr(given, field):
            raise ValueError(f"{field}={value!r} conflicts with {arg}={cls.__name__}(..., "
                             f"{field}={getattr(given, field)!r}); set it in one place")
    return given


def merge_flat(math_options: MuonMath | None, execution: Execution | None,
               flat: Mapping[str, Any]) -> tuple[MuonMath, Execution]:
    """The MuonMath and Execution of a DMuon call from the dataclasses given (None: the
    defaults) and DMuon's flat keywords `flat` (those given: name → value, FLAT_OPTIONS; each
    deprecated, and cost_cache without effect). TypeError naming an unknown keyword."""
    unknown = sorted(set(flat) - set(FLAT_OPTIONS) - {"cost_cache"})
    if unknown:
        raise TypeError(f"DMuon got unexpected keyword argument(s) {unknown}; options are lr, weight_decay, "
                        f"math, execution, adamw_*, muon_filter, process_group and {sorted(FLAT_OPTIONS)}")
    parts: dict[str, dict[str, Any]] = {"math": {}, "execution": {}}
    for name, value in flat.items():
        if name == "cost_cache":
            warn_deprecated(name, _COST_CACHE_GONE)
            continue
        arg, field = FLAT_OPTIONS[name]
        cls = "MuonMath" if arg == "math" else "Execution"
        warn_deprecated(name, f"DMuon's flat keyword {name}= is deprecated; pass {arg}=dmuon.{cls}({field}=...)")
        parts[arg][field] = value
    return (with_flat(MuonMath, math_options, "math", parts["math"]),
            with_flat(Execution, execution, "execution", parts["execution"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preset(Mapping):
    """A preset's DMuon arguments (:mod:`dmuon.presets`): typed, and a mapping, so that
    ``DMuon(model, **preset)`` passes ``lr``, ``weight_decay``, ``math`` and the AdamW
    options; any other option goes next to it."""

    lr: float
    weight_decay: float
    math: MuonMath
    adamw_lr: float | None
    adamw_betas: tuple[float, float]
    adamw_eps: float
    adamw_weight_decay: float | None

    def _keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())
