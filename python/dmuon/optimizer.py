"""`dmuon.DMuon`: Muon for matrices, AdamW for everything else, in one torch optimizer.

The Muon math (momentum, owner planning, communication, batched Newton–Schulz, lr
adjustment, apply) runs in C++: one step engine (``dmuon._C.engine.EngineRuntime``) on one
process, under DDP, FSDP2, HSDP, a fake world and for the weight-ownership mode's owned
matrices alike. AdamW is torch's own implementation. This module routes parameters,
validates options, keeps the state in ``self.state`` (so ``state_dict`` works as for any
torch optimizer). A step waits for two collectives with several ranks: the engine's start
agreement (structure, every rank's checks, NaN/Inf) and its result agreement.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam as _torch_adam

from dmuon.adamw_steps import DeviceSteps
from dmuon.backward_step import BackwardStep
from dmuon import distributed, rank_agreement
from dmuon._ops import _C
from dmuon.config import FLAT_OPTIONS, Execution, MuonMath, merge_flat
from dmuon.group_options import (ADAMW_OPTION_NAMES, COUNTER_KEYS, as_adamw_group, check_adamw_group,
                                 check_muon_group, check_unknown_keys, group_signature_options)
from dmuon.normuon import normuon_state_like
from dmuon.ownership import ownership_of
from dmuon.qk_clip import QKClip
from dmuon.param_groups import check_names_recorded, group_params, initial_groups, resolve_adamw_keys
from dmuon.routing import MatrixView, default_batch_dims, route_params
from dmuon.routing_summary import RoutingSummary, announce, entries_of
from dmuon.split_options import SPLIT_DEFAULTS, split_key, split_view
from dmuon.state_checks import adamw_state_dtype, check_state_dict, step_state_error

_MUON_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# Kept for code that imports them from here.
_COUNTER_KEYS = COUNTER_KEYS


class NonFiniteGradientError(FloatingPointError):
    """A gradient holds NaN or ±Inf (policy nonfinite='raise')."""


def _schedule_key(group: dict[str, Any]) -> tuple:
    """What a Muon group's Newton–Schulz schedule is built from (a checked group)."""
    coefficients, restarts = group["ns_coefficients"], group.get("ns_restarts")
    return (group["ns_algorithm"], group["ns_steps"],
            None if coefficients is None else tuple(tuple(float(x) for x in c) for c in coefficients),
            None if restarts is None else tuple(restarts), float(group["eps"]))


def _build_schedule(key: tuple) -> Any:
    """The C++ schedule (dmuon._C.NsSchedule) of a _schedule_key: the algorithm's default
    coefficients and restarts, each replaced where the group sets it."""
    algorithm, steps, coefficients, restarts, eps = key
    return _C.ns_schedule(algorithm, steps, None if coefficients is None else list(coefficients),
                          None if restarts is None else list(restarts), eps)


class DMuon(torch.optim.Optimizer):
    """Muon (orthogonalized momentum) for weight matrices and AdamW for the rest.

    ``params`` is an ``nn.Module`` (parameters are routed automatically, see
    :mod:`dmuon.routing`), an iterable of tensors or ``(name, tensor)`` pairs (``ndim ≥ 2``
    → Muon), or param-group dicts with ``use_muon=True/False`` and any per-group option.

    Options (:mod:`dmuon.config`): ``lr`` and decoupled ``weight_decay`` (group keys, as in
    torch optimizers); ``math``: a :class:`dmuon.MuonMath` (momentum, Nesterov, the
    Newton–Schulz algorithm, steps, coefficients and restarts, ``eps``, ``adjust_lr``; a
    param group may set any of its fields as a key); ``execution``: a
    :class:`dmuon.Execution` (mode, buckets, wire dtype, planner, cost model, non-finite
    policy, code-path switches). The flat keywords of earlier releases (``momentum=…``,
    ``ns_steps=…``, ``bucket_size_mb=…``, ``nonfinite=…``; dmuon.config.FLAT_OPTIONS) set
    the same fields; one that differs from a dataclass passed with it is an error.
    AdamW options (groups with ``use_muon=False``): ``adamw_lr`` (default: ``lr``),
    ``adamw_betas``, ``adamw_eps``, ``adamw_weight_decay`` (default: ``weight_decay``); in
    param groups that DMuon routes, ``adamw_lr`` wins over a group's ``lr`` for the AdamW part
    (:mod:`dmuon.param_groups`, also for torch.optim's ``param_names``/``fused``/``foreach``).
    ``execution.nonfinite``: "raise" (error naming the parameter and step) or "skip" (the
    step changes nothing and is counted in ``num_skipped_steps``).

    Conventions of torch optimizers: frozen parameters stay in the optimizer (and train once
    unfrozen); Muon groups have ``momentum`` and AdamW groups ``betas`` (and ``momentum`` =
    β1), and ``defaults`` has ``momentum``, so schedulers that cycle momentum work on both;
    ``load_state_dict`` checks the whole checkpoint before it changes anything, and a step
    checks everything it will touch before it writes anything. :mod:`dmuon.presets` holds
    the conventions of torch.optim.Muon, Moonlight and Keller Jordan's Muon.

    Distribution (see :mod:`dmuon.distributed`): DTensor parameters sharded on dim 0
    (FSDP2) or replicated parameters on an initialized process group (DDP) are
    orthogonalized once, on an owner rank chosen by the planner; replicas are checked to be
    equal at construction. ``process_group``: the group of replicated parameters (default:
    the default group; "local": every rank trains its own model). How the owners are
    planned and the step pipelined: :class:`dmuon.Execution`.
    """

    def __init__(
        self,
        params: nn.Module | Iterable[Any],
        lr: float = 1e-3,
        *,
        weight_decay: float = 0.01,
        math: MuonMath | None = None,
        execution: Execution | None = None,
        adamw_lr: float | None = None,
        adamw_betas: tuple[float, float] = (0.9, 0.999),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float | None = None,
        muon_filter: Callable[[str, nn.Parameter], bool] | None = None,
        process_group: Any = None,
        qk_clip: QKClip | None = None,
        **flat: Any,
    ) -> None:
        unknown = sorted(set(flat) - set(FLAT_OPTIONS))
        if unknown:
            raise TypeError(f"DMuon got unexpected keyword argument(s) {unknown}; options are lr, weight_decay, "
                            f"math, execution, adamw_*, muon_filter, process_group and {sorted(FLAT_OPTIONS)}")
        math, execution = merge_flat(math, execution, flat)
        if qk_clip is not None and not isinstance(qk_clip, QKClip):
            raise TypeError(f"qk_clip must be a dmuon.QKClip or None, got {type(qk_clip).__name__}")
        # MuonClip's QK-clip, run after every applied step (dmuon/qk_clip.py).
        self.qk_clip = qk_clip
        if isinstance(process_group, str) and process_group != rank_agreement.LOCAL:
            raise ValueError(f"process_group must be None (the default group), a ProcessGroup or "
                             f"{rank_agreement.LOCAL!r} (every rank trains its own model), got {process_group!r}")
        self.math = math
        self.execution = execution
        self.nonfinite = execution.nonfinite
        # The keyword arguments of the runtime's options (dmuon._C.dist.RuntimeOptions).
        self._runtime_options = execution.runtime_options()
        self._process_group = process_group
        self._runtime = None
        self._runtime_split: tuple | None = None  # split_key the runtime was built with
        # The step begun inside backward (dmuon.backward_step); resolved with the runtime.
        self._backward = BackwardStep(self)
        self._adamw_device_steps = DeviceSteps()
        self._backward_step_on = False
        self._schedules: dict[int, tuple[tuple, Any]] = {}  # group index → (its _schedule_key, NsSchedule)
        self._muon_defaults = dict(lr=lr, weight_decay=weight_decay, **math.as_dict(), **SPLIT_DEFAULTS)
        self._adamw_defaults = dict(
            lr=lr if adamw_lr is None else adamw_lr,
            weight_decay=weight_decay if adamw_weight_decay is None else adamw_weight_decay,
            betas=adamw_betas, eps=adamw_eps)
        # Options are checked under the names they were given by (adamw_betas, adamw_eps…).
        check_muon_group(dict(self._muon_defaults), "")
        check_adamw_group(dict(self._adamw_defaults), "", names=ADAMW_OPTION_NAMES)
        self._param_names: dict[int, str] = {}
        self._views: dict[int, MatrixView] = {}
        self._reasons: dict[int, str] = {}
        self._ownership = None
        self._signature: tuple | None = None  # (split_key, structure signature, its lines)
        self._verified_state: dict[int, tuple] = {}  # id(param) → ids of its state tensors checked
        self._group = None  # the Muon parameters' process group (None: one process)
        self._placement_cache = None  # (ids of the Muon parameters, their placements, the group)
        initial = initial_groups(params, muon_filter, {"lr": adamw_lr, "weight_decay": adamw_weight_decay})
        for r in initial.routes.values():
            self._param_names[id(r.param)] = r.name
            self._reasons[id(r.param)] = r.reason
            if r.use_muon:
                self._views[id(r.param)] = r.view
        # NOTE: torch's OneCycleLR/CyclicLR cycle momentum when `defaults` has it.
        super().__init__(initial.groups, {"lr": lr, "momentum": math.momentum})
        self._check_ranks_agree()
        self._check_replicas()
        self._ownership = self._find_ownership()
        if isinstance(params, nn.Module) and execution.backward_step is not False:
            self._backward.attach(params)
        announce(self.routing_summary(), not dist.is_initialized() or dist.get_rank() == 0)

    # ----------------------------------------------------------------- construction
    @property
    def _batch_dims(self) -> dict[int, int]:
        """id(param) → batch_dims of every Muon parameter (1: a stack of matrices)."""
        return {key: view.batch_dims for key, view in self._views.items()}

    def matrix_view(self, param: torch.Tensor) -> MatrixView:
        """How Muon sees `param` as matrices (stack, row blocks, transposition), its group's
        split (split_rows, split_heads, split_dim) applied; ValueError naming it when the split does not fit."""
        view = self._views.get(id(param)) or MatrixView(batch_dims=default_batch_dims(param))
        for g_idx, group in enumerate(self.param_groups):
            if group["use_muon"] and any(p is param for p in group["params"]):
                return split_view(view, param, group, self.param_name(param), f"param group {g_idx}: ")
        return view

    def _split_error(self) -> str:
        """Why a Muon group's split does not fit one of its parameters ("" if every one fits)."""
        for g_idx, group in enumerate(self.param_groups):
            if not group["use_muon"] or (group.get("split_rows") is None and group.get("split_heads") is None):
                continue
            for p in group["params"]:
                if ownership_of(p) is not None:
                    return (f"param group {g_idx}: split_rows/split_heads for parameter {self.param_name(p)!r}, which "
                            "own_matrices owns: the weight-ownership mode does not split matrices")
                try:
                    # NOTE: the group is known here: no search of the groups per parameter.
                    view = self._views.get(id(p)) or MatrixView(batch_dims=default_batch_dims(p))
                    split_view(view, p, group, self.param_name(p), f"param group {g_idx}: ")
                except ValueError as error:
                    return str(error)
        return ""

    def routing_summary(self) -> RoutingSummary:
        """Parameters and elements per side, every decision with its reason, the AdamW matrices
        by name (str() prints the table; .line() the one line logged at construction)."""
        def reason(p: torch.Tensor, use_muon: bool) -> str:
            return self._reasons.get(id(p), "param group with use_muon=" + str(use_muon))
        return entries_of(self.param_groups, self.param_name, reason)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Fill a group's options from the Muon or AdamW defaults and validate them. Without
        ``use_muon``, the group is routed (by names for (name, tensor) pairs, else by shape)
        and must be all Muon or all AdamW."""
        group = dict(param_group)
        group_idx = len(self.param_groups)
        if "params" not in group:
            raise ValueError(f"param group {group_idx} has no 'params'")
        given = group_params(group, group_idx, lambda p: self._param_names.get(id(p)))
        names, tensors, entries = given.names, given.tensors, given.entries
        check_names_recorded(self.param_groups, given.named, group_idx, names)
        for name, param in zip(names, tensors):
            self._validate_param(name, param, None)
        routed = {id(r.param): r for r in route_params(entries, prefix=f"param_groups[{group_idx}].params",
                                                        warn=False)}
        if "use_muon" not in group:
            kinds = {id(p): routed[id(p)].use_muon for p in tensors}
            if len(set(kinds.values())) > 1:
                muon = next(n for n, p in zip(names, tensors) if kinds[id(p)])
                other = next(n for n, p in zip(names, tensors) if not kinds[id(p)])
                raise ValueError(f"param group {group_idx} mixes Muon parameters ({muon!r}) and AdamW ones "
                                 f"({other!r}); set use_muon=True or False, or pass two groups")
            group["use_muon"] = next(iter(kinds.values())) if kinds else True
        use_muon = bool(group["use_muon"])
        resolve_adamw_keys(group, group_idx)
        check_unknown_keys(group, group_idx, use_muon)
        for key, value in (self._muon_defaults if use_muon else self._adamw_defaults).items():
            group.setdefault(key, value)
        for key in COUNTER_KEYS:
            group.setdefault(key, 0)
        group["params"] = tensors
        group.pop("param_names", None)
        if given.named:
            group["param_names"] = names  # NOTE: as torch.optim records them (torchtitan's checkpoint reads them)
        for name, param in zip(names, tensors):
            self._param_names[id(param)] = name
            self._validate_param(name, param, use_muon)
            if use_muon and id(param) not in self._views:
                r = routed[id(param)]
                self._views[id(param)] = r.view if r.use_muon else MatrixView(batch_dims=default_batch_dims(param))
        where = f"param group {group_idx}{'' if use_muon else ' (AdamW)'}: "
        if use_muon:
            check_muon_group(group, where)
            for name, param in zip(names, tensors):
                split_view(self._views[id(param)], param, group, name, where)
            self._group_schedule(group_idx, group)  # NOTE: built once, here (see _group_schedule)
        else:
            check_adamw_group(group, where)
            group = as_adamw_group(group, where)
        super().add_param_group(group)
        self._runtime = None  # NOTE: rebuilt (collectively) at the next step
        self._signature = None
        self._group = self._placements()[1]
        if getattr(self, "_ownership", None) is not None:
            self._ownership = self._find_ownership()

    @staticmethod
    def _validate_param(name: str, param: torch.Tensor, use_muon: bool | None) -> None:
        """`use_muon` None: only what every parameter needs."""
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"parameter {name!r} is a {type(param).__name__}, not a tensor")
        if not param.is_floating_point():
            raise TypeError(f"parameter {name!r} has dtype {param.dtype}; DMuon optimizes floating-point parameters")
        if use_muon:
            if param.dim() < 2:
                raise ValueError(f"parameter {name!r} of shape {tuple(param.shape)} was put in a Muon group, "
                                 "but Muon needs a matrix (ndim >= 2); put it in a use_muon=False group")
            if param.dtype not in _MUON_DTYPES:
                raise TypeError(f"parameter {name!r} has dtype {param.dtype}; Muon supports {[str(d) for d in _MUON_DTYPES]}")

    def _group_schedule(self, g_idx: int, group: dict[str, Any]) -> Any:
        """The NsSchedule of Muon group `g_idx`, built when the group was added; built again
        only when its ns_* keys or eps changed since (set by the user, or a checkpoint loaded):
        the step hands the built C++ object over, nothing is parsed per step."""
        key = _schedule_key(group)
        entry = self._schedules.get(g_idx)
        if entry is None or entry[0] != key:
            entry = self._schedules[g_idx] = (key, _build_schedule(key))
        return entry[1]

    def _group_defaults(self, use_muon: bool) -> dict[str, Any]:
        return dict(self._muon_defaults if use_muon else self._adamw_defaults)

    def param_name(self, param: torch.Tensor) -> str:
        """The name DMuon uses for `param` in messages."""
        return self._param_names.get(id(param), "<unnamed>")

    # ------------------------------------------------------------ distribution
    def _muon_params(self) -> list[tuple[int, torch.Tensor]]:
        """(group index, parameter) of every Muon parameter the step runtime handles (the
        owned ones of the weight-ownership mode excluded), in group order."""
        return [(g_idx, p) for g_idx, group in enumerate(self.param_groups) if group["use_muon"]
                for p in group["params"] if ownership_of(p) is None]

    # ------------------------------------------------------- weight ownership
    def _find_ownership(self) -> Any:
        """The OwnedMatrices of the owned parameters (at most one), checked complete."""
        handles = {}
        for group in self.param_groups:
            for p in group["params"]:
                handle = ownership_of(p)
                if handle is not None:
                    if not group["use_muon"]:
                        raise ValueError(f"parameter {self.param_name(p)!r} is owned (dmuon.own_matrices) "
                                         "but sits in an AdamW group; owned matrices must use Muon")
                    handles[id(handle)] = handle
        if len(handles) > 1:
            raise ValueError("DMuon's parameters come from several own_matrices calls; use one per model")
        if not handles:
            return None
        handle = next(iter(handles.values()))
        mine = {id(p) for group in self.param_groups for p in group["params"]}
        missing = [e.name for e in handle._entries if id(e.master) not in mine]
        if missing:
            raise ValueError(f"every owned matrix must be in this optimizer, but {missing[:3]} are not")
        handle._attach(self)
        return handle

    @torch.no_grad()
    def init_state(self) -> None:
        """Creates every state entry a step would create (zeros), without stepping: the
        target structure for loading a checkpoint into a fresh optimizer. NOTE: no collective
        and no counter changes: what it creates follows from the param groups alone (the same
        on every rank), and a step from it computes what a step from no state does."""
        handle = self._ownership
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if group["use_muon"]:
                    if handle is not None and ownership_of(p) is handle and not handle.is_owner(p):
                        continue  # the owner holds it (materialized() shares it)
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group.get("normuon") and "normuon_v" not in state:
                        state["normuon_v"] = normuon_state_like(p, self._views[id(p)].batch_dims)
                else:
                    self._adamw_state(p)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load_state_dict, after checking the whole checkpoint against these param
        groups (structure, options, every state entry's keys, shapes and dtypes): a mismatch
        raises ValueError naming it, and nothing is changed. Floating-point state is cast to
        its parameter's dtype as torch does, except AdamW moments of float16 parameters, which
        stay float32. NOTE: load_state_dict pre-hooks run after the check."""
        check_state_dict(state_dict, self.param_groups, self.param_name, self._group_defaults)
        super().load_state_dict(state_dict)
        for g_idx, group in enumerate(self.param_groups):
            if not group["use_muon"]:
                group = self.param_groups[g_idx] = as_adamw_group(group, f"param group {g_idx} (AdamW): ")
            else:
                group.setdefault("ns_restarts", None)  # NOTE: checkpoints saved before it existed
                for key, value in SPLIT_DEFAULTS.items():
                    group.setdefault(key, value)
                self._group_schedule(g_idx, group)
            for key in COUNTER_KEYS:
                group.setdefault(key, 0)
        self._keep_float32_moments(state_dict)
        self._signature = None

    def _keep_float32_moments(self, state_dict: dict[str, Any]) -> None:
        """AdamW moments of float16 parameters from the checkpoint's own values (torch's load
        cast them to float16, which loses the small second moments)."""
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params):
            entry = self.state.get(p)
            if p.dtype != torch.float16 or not entry or "exp_avg" not in entry:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                saved = state_dict["state"][saved_id][key]
                entry[key] = saved.to(dtype=adamw_state_dtype(p)).to(device=entry[key].device)

    def _placements(self) -> tuple[list[distributed.Placement], Any]:
        muon = self._muon_params()
        names = [self.param_name(p) for _, p in muon]
        if self._process_group == rank_agreement.LOCAL:
            # Every rank trains its own model: no group, whatever is initialized.
            for name, (_, p) in zip(names, muon):
                if isinstance(p, DTensor):
                    raise ValueError(f"process_group={rank_agreement.LOCAL!r}, but parameter {name!r} is a DTensor "
                                     "(its mesh shares it across ranks)")
            return [distributed.Placement(global_shape=tuple(p.shape), sharded=False, group=None)
                    for _, p in muon], None
        # NOTE: the mesh layout gathers every rank's mesh coordinates (a collective): made
        # once per set of Muon parameters.
        key = tuple(id(p) for _, p in muon)
        if self._placement_cache is None or self._placement_cache[0] != key:
            placements, group = distributed.placements_of(names, [p for _, p in muon], self._process_group)
            self._placement_cache = (key, placements, group)
        return list(self._placement_cache[1]), self._placement_cache[2]

    def _check_replicas(self) -> None:
        """The parameters treated as replicas (not sharded, on a multi-rank group) must be equal
        on every rank: one all_reduce of checksums, an error naming the first that is not."""
        placements, group = self._placements()
        self._group = group
        replicas = [(self.param_name(p), distributed.local(p)) for (_, p), pl in zip(self._muon_params(), placements)
                    if not pl.sharded and pl.group is not None and not pl.on_mesh]
        rank_agreement.check_replicas_equal(group, [n for n, _ in replicas], [t for _, t in replicas])

    def _check_ranks_agree(self) -> None:
        """Every rank must hold the same parameters with the same options (else: error on all)."""
        placements, group = self._placements()
        signature = []
        for g_idx, group_options in enumerate(self.param_groups):
            options = group_signature_options(group_options)
            signature.append(("group", g_idx, options))
            for p in group_options["params"]:
                placement = getattr(p, "placements", None)
                signature.append((self.param_name(p), tuple(p.shape), str(p.dtype), repr(placement)))
        distributed.check_same_parameters_on_all_ranks(group, signature)

    def _ensure_runtime(self, checks: Any = None) -> Any:
        """The C++ step runtime for the current Muon parameters (built collectively); built
        again when a group's split changed (the user or a loaded checkpoint set it). Before
        it is built, the ranks agree on `checks` (this step's, else made here) in the same
        collective as a step's start agreement, so that a rank that builds it alone (its
        param groups changed) meets the others' step and every rank raises."""
        if self._runtime is not None and self._runtime_split != split_key(self.param_groups):
            self._runtime = None
        if self._runtime is None:
            muon = self._muon_params()
            handle = self._ownership
            owned = [e.master for e in handle._entries] if handle is not None else []
            # NOTE: one runtime drives one device (its collectives, flags and fused batches).
            devices = {}
            for p in [distributed.local(p) for _, p in muon] + owned:
                devices.setdefault(p.device, self.param_name(p))
            if len(devices) > 1:
                (first, a), (second, b) = list(devices.items())[:2]
                raise ValueError(f"DMuon needs every Muon parameter on one device: {a!r} is on {first}, "
                                 f"{b!r} on {second}")
            device_type = "cuda" if next(iter(devices), torch.device("cpu")).type == "cuda" else "cpu"
            placements, group = self._placements()
            if handle is not None:
                group = self._owned_world(group)
            _C.engine.agree_start(distributed.group_name(group), device_type,
                                  checks if checks is not None else self._step_checks(),
                                  self.param_groups[0]["num_steps"] + 1)
            self._runtime_split = split_key(self.param_groups)
            layouts = [self._layout(p, pl) for (_, p), pl in zip(muon, placements)]
            # NOTE: None: off (measured default, docs/configuration.md: on the fake ranks of
            # worlds 8 and 64 the step begun from backward never beat the step after it).
            wanted = self.execution.backward_step
            # NOTE: NorMuon's row state is made at step(): the step of such groups cannot
            # begin inside backward (column blocks can: they are pieces of the tensors).
            unable = [f"param_groups[{g_idx}] (normuon=True)" for g_idx, g in enumerate(self.param_groups)
                      if g["use_muon"] and g.get("normuon")]
            if wanted and unable:
                raise ValueError(f"Execution.backward_step=True cannot start the step inside backward for "
                                 f"{unable[0]}; set backward_step=None or False")
            # NOTE: the owned matrices' step always begins inside backward, where NorMuon's
            # pass does not run yet.
            group_of = {id(p): g_idx for g_idx, g in enumerate(self.param_groups) for p in g["params"]}
            owned_normuon = [e.name for e in (handle._entries if handle is not None else [])
                             if self.param_groups[group_of[id(e.master)]].get("normuon")]
            if owned_normuon:
                raise ValueError(f"normuon=True for parameter {owned_normuon[0]!r}, which dmuon.own_matrices owns: the "
                                 "weight-ownership mode does not apply NorMuon; leave it out of own_matrices or of "
                                 "the normuon group")
            self._backward_step_on = (bool(wanted) and bool(self._backward.attached)
                                      and handle is None and not unable)
            # NOTE: the engine times each Muon group's NS batches itself when it plans
            # (cost_model "profile"; rank 0 times them and shares them: step/cost_profile.h).
            group_options, slot = self._muon_group_options()
            options = _C.dist.RuntimeOptions(device_type=device_type, backward_order=self._backward_step_on,
                                             cost_schedules=[g.schedule for g in group_options],
                                             **self._runtime_options)
            names = [self.param_name(p) for _, p in muon]
            dtypes = [str(p.dtype).removeprefix("torch.") for _, p in muon]
            self._runtime = _C.engine.EngineRuntime(
                distributed.group_name(group), names, layouts, dtypes, [slot[g_idx] for g_idx, _ in muon], options,
                owned=handle.exchange if handle is not None else None,
                owned_group_slot=[slot[group_of[id(p)]] for p in owned])
        return self._runtime

    def _owned_world(self, group: Any) -> Any:
        """The engine's group with owned matrices: the ownership mesh's world group, which
        the Muon parameters not owned must span too (or none: one process)."""
        world = self._ownership._groups.world
        if group is not None and (world is None or sorted(dist.get_process_group_ranks(group))
                                  != sorted(dist.get_process_group_ranks(world))):
            raise ValueError("the Muon parameters that dmuon.own_matrices does not own live on other ranks than its "
                             "mesh; own every matrix, or give own_matrices the mesh of the others")
        return world

    def _layout(self, param: torch.Tensor, placement: distributed.Placement) -> Any:
        """The C++ runtime's view of one Muon parameter: shape, matrices (row or column
        blocks of a split), sharding."""
        view = self.matrix_view(param)
        if view.col_blocks > 1 and placement.on_mesh:
            # NOTE: the ItemTable cuts column blocks out of any box (a TP rank's columns
            # too), but only Shard(0) rows and replicas are tested end to end.
            raise ValueError(f"split_heads={view.col_blocks}, split_dim=1 for parameter {self.param_name(param)!r}: it "
                             f"is placed on a {len(placement.mesh_shape)}-D mesh {placement.mesh_placements}; column "
                             "blocks take a parameter sharded on dim 0 (FSDP2) or replicated")
        mesh = {}
        if placement.on_mesh:
            mesh = dict(mesh_shape=list(placement.mesh_shape), placements=list(placement.mesh_placements),
                        rank_coords=[list(c) for c in placement.rank_coords])
        return _C.dist.ParamLayout(list(placement.global_shape), view.batch_dims, placement.sharded,
                                   row_blocks=list(view.row_blocks), transposed=view.transposed,
                                   col_blocks=view.col_blocks, **mesh)

    @property
    def runtime(self) -> Any:
        """The step runtime (owners, buckets, plan, last step's statistics)."""
        return self._ensure_runtime()

    # ----------------------------------------------------------------------- step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        step_idx = self.param_groups[0]["num_steps"] + 1
        # NOTE: everything this step touches (group options, gradients, state of both halves)
        # is checked before anything is written; the ranks agree that all of them passed and
        # hold the same groups in the step's start agreement, its first collective.
        # NOTE: host ranges for torch.profiler (`bench e2e --profile` sums the "dmuon.*" ones).
        with torch.profiler.record_function("dmuon.step.inputs"):
            checks = self._step_checks()
        try:
            return self._engine_step(self._ensure_runtime(checks), step_idx, loss, checks)
        except BaseException:
            if self.qk_clip is not None:
                self.qk_clip.reset()
            if self._ownership is not None:
                # NOTE: the owned matrices' window closes with the runtime's step; a step that
                # failed before it (every rank raised in the start agreement before the
                # runtime was made) closes it here. Closed already: nothing left to do; a
                # collective that fails here has failed on the way to the error raised.
                with contextlib.suppress(Exception):
                    self._ownership.exchange.end_window(step_idx)
            raise

    def attach_backward_step(self, model: nn.Module) -> None:
        """Start the step from `model`'s backward (its FSDP2 groups, or `model` as DDP with
        gradient_as_bucket_view=True): dmuon.backward_step. DMuon(module) attaches itself."""
        if self._runtime is not None:
            raise RuntimeError("attach_backward_step: call it before the first step() (the runtime's stages "
                               "are ordered for backward when it is made)")
        self._backward.attach(model)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # NOTE: gradients of a begun step are going away: it is discarded, nothing written.
        self._backward.discard()
        super().zero_grad(set_to_none=set_to_none)

    def _engine_step(self, runtime: Any, step_idx: int, loss: Any, checks: Any) -> Any:
        """One step through the step engine: every Muon parameter's check, momentum, NS and
        apply (the owned matrices' too), the AdamW gradients checked in the same pass and
        start agreement; then AdamW; then the result agreement (QK-clip's maxima in it)."""
        # NOTE: with several ranks the engine returns before its result agreement, whose host
        # read waits for the device: the AdamW part (its gradients agreed finite already) is
        # enqueued meanwhile, then the results are agreed. A non-finite orthogonalized update
        # still raises on every rank, after the rest of the step, AdamW's part included, was
        # applied.
        defer = runtime.world_size > 1
        try:
            with torch.profiler.record_function("dmuon.step.engine"):
                applied = self._engine_step_rest(runtime, step_idx, defer, checks)
        finally:
            if self._ownership is not None:
                self._ownership._after_step()
        if applied is not True:
            if self.qk_clip is not None:
                self.qk_clip.reset()  # NOTE: a skipped step forgets its maxima
            return self._refused(applied, step_idx, loss)
        clip = self.qk_clip
        # NOTE: the clip's maxima ride in the result agreement where it spans the clip's
        # group; a clip given its own process_group agrees over it itself (QKClip.apply).
        folded = clip is not None and clip.agrees_with(runtime.world_size)
        agreed = None
        try:
            with torch.profiler.record_function("dmuon.step.adamw"):
                for group in self.param_groups:
                    group["num_steps"] += 1
                    if not group["use_muon"]:
                        active = [p for p in group["params"] if p.grad is not None]
                        if active:
                            self._adamw_group_step(group, active)
        finally:
            # NOTE: collective: every rank agrees even when its AdamW part raised.
            with torch.profiler.record_function("dmuon.step.agree_results"):
                agreed = self._engine_call(runtime.agree_results, clip.local_keys() if folded else [])
        if clip is not None:
            clip.apply(agreed if folded else None)
        return loss

    def _engine_step_rest(self, runtime: Any, step_idx: int, defer: bool, checks: Any) -> Any:
        """The engine's step of every Muon parameter (the owned ones after the others),
        AdamW's gradients checked with it: True when applied, else the names of the
        parameters whose gradients were not finite (nothing was written). `defer`: an
        applied step's result agreement is left to runtime.agree_results()."""
        muon = self._muon_params()
        muon_ids = {id(p) for _, p in muon}
        group_options, _ = self._muon_group_options()
        params, grads, buffers, fresh = [], [], [], []
        row_states, fresh_v = [], []
        normuon_ids = {id(p) for group in self.param_groups if group["use_muon"] and group.get("normuon", False)
                       for p in group["params"]}
        # Buffers made for a step begun inside backward (the engine holds them already), and
        # whether this rank's begun work is stale (agreed in the start agreement).
        begun, changed = self._backward.take()
        checks.changed = changed
        for i, (g_idx, p) in enumerate(muon):
            params.append(distributed.local(p))
            if p.grad is None:
                grads.append(None)
                buffers.append(None)
                row_states.append(None)
                continue
            # NorMuon's v: one float32 per row of every matrix (rows as the parameter stores them).
            v = self.state.get(p, {}).get("normuon_v") if id(p) in normuon_ids else None
            if id(p) in normuon_ids and v is None:
                v = normuon_state_like(p, self._views[id(p)].batch_dims)
                fresh_v.append((p, v))
            row_states.append(distributed.local(v) if v is not None else None)
            # NOTE: a buffer enters the state only once a step applied it (a refused step
            # leaves the state as it was).
            buffer = self.state.get(p, {}).get("momentum_buffer")
            if buffer is None:
                buffer = begun.get(i)
                if buffer is None:
                    buffer = torch.zeros_like(p, memory_format=torch.preserve_format)
                fresh.append((p, buffer))
            grads.append(distributed.local(p.grad))
            buffers.append(distributed.local(buffer))
        # The owned matrices: their masters and the owner's momentum buffers (the gradients are
        # the exchange's).
        handle = self._ownership
        for e in handle._entries if handle is not None else []:
            mine = e.mine
            params.append(e.master if mine else None)
            grads.append(None)
            row_states.append(None)
            buffer = self.state.get(e.master, {}).get("momentum_buffer") if mine else None
            if mine and buffer is None and handle.exchange.contributed(e.index):
                buffer = begun.get(len(muon) + e.index)
                if buffer is None:
                    buffer = torch.zeros_like(e.master, memory_format=torch.contiguous_format)
                fresh.append((e.master, buffer))
            buffers.append(buffer)
        # NOTE: every rank passes the same list (an AdamW parameter without a gradient as
        # None), so that the engine's agreement has one size on every rank; it agrees on the
        # gradients' presence too (on some ranks only: an error on every rank naming it).
        others = [p for group in self.param_groups if not group["use_muon"] for p in group["params"]
                  if id(p) not in muon_ids]
        extra = [distributed.local(p.grad) if p.grad is not None else None for p in others]
        outcome = self._engine_call(runtime.step, params, grads, buffers, group_options, step_idx,
                                    [self.param_name(p) for p in others], extra, row_states, defer, checks)
        if not outcome["applied"]:
            stepped = [p for _, p in muon] + ([e.master for e in handle._entries] if handle is not None else [])
            bad = {id(stepped[i]) for i in outcome["nonfinite_params"]} | {id(others[k]) for k in outcome["nonfinite_extra"]}
            return [self.param_name(p) for group in self.param_groups for p in group["params"] if id(p) in bad]
        for p, buffer in fresh:
            self.state[p]["momentum_buffer"] = buffer
        for p, v in fresh_v:
            self.state[p]["normuon_v"] = v
        return True

    def _refused(self, names: list[str], step_idx: int, loss: Any) -> Any:
        """A step refused for the non-finite gradients of `names` (nothing was written):
        raises under nonfinite="raise", else counts it as skipped."""
        if self.nonfinite == "raise":
            raise NonFiniteGradientError(
                f"non-finite gradient (NaN or Inf) in parameter {names[0]!r} at step {step_idx}"
                + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")
                + "; nothing was updated. Use DMuon(..., nonfinite='skip') to skip such steps.")
        for group in self.param_groups:
            group["num_steps"] += 1
            group["num_skipped_steps"] += 1
        return loss

    @staticmethod
    def _engine_call(call: Callable[..., Any], *args: Any) -> Any:
        """call(*args) (the runtime's step or agree_results); a momentum buffer holding NaN/Inf
        raises NonFiniteGradientError (the engine refuses the step on every rank, naming it)."""
        try:
            return call(*args)
        except RuntimeError as error:
            if "(corrupt optimizer state)" in str(error):
                raise NonFiniteGradientError(str(error)) from None
            raise

    def _step_checks(self) -> Any:
        """This rank's part of the step's start agreement: the param groups' structure (its
        signature and, to name a difference, its lines) and this rank's checks."""
        split = split_key(self.param_groups)
        if self._signature is None or self._signature[0] != split:
            self._signature = (split, rank_agreement.structure_signature(self.param_groups),
                               rank_agreement.describe_groups(self.param_groups, self.param_name))
        _, signature, describe = self._signature
        return _C.engine.StepChecks(signature=signature, error=self._step_input_error(), describe=describe)

    def _step_input_error(self) -> str:
        """Why this rank cannot step ("" if it can): a bad group option (a scheduler or the user
        may have set it), or a gradient or state tensor that does not fit its parameter."""
        for g_idx, group in enumerate(self.param_groups):
            try:
                if group["use_muon"]:
                    check_muon_group(group, f"param group {g_idx}: ")
                else:
                    check_adamw_group(group, f"param group {g_idx} (AdamW): ")
            except ValueError as error:
                return f"{error}; nothing was updated"
        split_error = self._split_error()
        if split_error:
            return f"{split_error}; nothing was updated"
        # NOTE: the engine reads a gradient's local tensor as the parameter's box: a DTensor
        # gradient placed otherwise (e.g. Partial, or another shard dim of equal size) would
        # be read as the wrong piece.
        for _, p in self._muon_params():
            g = p.grad
            if isinstance(p, DTensor) and isinstance(g, DTensor) and (
                    tuple(g.placements) != tuple(p.placements) or g.device_mesh != p.device_mesh):
                return (f"the gradient of Muon parameter {self.param_name(p)!r} is placed {tuple(g.placements)} on "
                        f"{g.device_mesh}, but the parameter {tuple(p.placements)} on {p.device_mesh} (redistribute "
                        "it like the parameter); nothing was updated")
        return step_state_error(self.param_groups, self.state, self.param_name, distributed.local,
                                skip=lambda p: ownership_of(p) is not None, verified=self._verified_state)

    def _muon_group_options(self) -> tuple[list[Any], dict[int, int]]:
        """C++ options of every Muon group, and each Muon group's slot among them."""
        group_options, group_slot = [], {}
        for g_idx, group in enumerate(self.param_groups):
            if group["use_muon"]:
                group_slot[g_idx] = len(group_options)
                group_options.append(_C.dist.GroupOptions(
                    lr=float(group["lr"]), weight_decay=float(group["weight_decay"]),
                    momentum=float(group["momentum"]), nesterov=bool(group["nesterov"]),
                    adjust_lr=group["adjust_lr"] or "none", schedule=self._group_schedule(g_idx, group),
                    normuon=bool(group.get("normuon", False)),
                    normuon_beta2=float(group.get("normuon_beta2", 0.95)),
                    normuon_eps=float(group.get("normuon_eps", 1e-8))))
        return group_options, group_slot

    def _adamw_state(self, p: torch.Tensor) -> dict[str, Any]:
        """`p`'s AdamW state, created (zeros, step 0) on first use (float32 moments for float16)."""
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            dtype = adamw_state_dtype(p)
            state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
        return state

    def _adamw_group_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        """torch's AdamW over `params`. NOTE: float16 parameters step through float32 copies
        (their moments are float32) and are rounded back: in float16 the second moment of small
        gradients underflows to 0 and eps (1e-8) to 0, and the update divides by it.
        NOTE: on the local tensors of DTensor parameters whose gradient lies as they do (the
        same placements): AdamW is elementwise, so each rank's shard steps alone, bitwise as
        through DTensor, without DTensor's dispatch of each of AdamW's passes (measured on a
        CPU fake rank of world 64, Qwen2.5-0.5B's 122 AdamW parameters: 8.7 ms through
        DTensor, 4.6 ms on the local tensors, compute included); on one CUDA device, through
        torch's fused kernel (dmuon.adamw_steps); on the CPU through its foreach passes."""
        exp_avgs, exp_avg_sqs, steps, targets, grads, halves = [], [], [], [], [], []
        states = [self._adamw_state(p) for p in params]
        # NOTE: one form for the whole list (torch's foreach passes take no mix of the two).
        local = all(distributed.same_layout(p, p.grad) and distributed.same_layout(p, state["exp_avg"])
                    and distributed.same_layout(p, state["exp_avg_sq"]) for p, state in zip(params, states))
        view = distributed.local if local else (lambda t: t)
        for p, state in zip(params, states):
            exp_avgs.append(view(state["exp_avg"]))
            exp_avg_sqs.append(view(state["exp_avg_sq"]))
            steps.append(state["step"])
            if p.dtype == torch.float16:
                targets.append(view(p).float())
                grads.append(view(p.grad).float())
                halves.append((view(p), targets[-1]))
            else:
                targets.append(view(p))
                grads.append(view(p.grad))
        beta1, beta2 = group["betas"]
        options = dict(decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                       weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
        # The one device every local tensor is on (None: DTensors, or several devices).
        devices = {t.device for t in targets} if local else set()
        device = next(iter(devices)) if len(devices) == 1 else None
        if device is not None and device.type == "cuda":
            # NOTE: torch's fused kernel (one launch per dtype; adamw_steps.py says why),
            # on device copies of the CPU step counters.
            device_steps = self._adamw_device_steps.of(id(group), steps, device)
            _torch_adam(targets, grads, exp_avgs, exp_avg_sqs, [], device_steps, fused=True, **options)
            self._adamw_device_steps.advanced(id(group), steps)
        else:
            # NOTE: on the CPU, torch's foreach passes: bitwise what torch.optim.AdamW's default
            # (one tensor at a time) computes there, in fewer calls (143 small tensors, the
            # AdamW part of Qwen2.5-7B at 1/64 width on a CPU fake rank of world 64: 3.4 ms
            # one at a time, 1.8 ms foreach).
            on_cpu = device is not None and device.type == "cpu"
            _torch_adam(targets, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True if on_cpu else None, **options)
        for p, full in halves:
            p.copy_(full)
