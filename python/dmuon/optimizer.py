"""`dmuon.DMuon`: Muon for matrices, AdamW for everything else, in one torch optimizer.

The Muon math (momentum, owner planning, communication, batched Newton–Schulz, lr
adjustment, apply) runs in C++: one step engine (``dmuon._C.engine.EngineRuntime``) on one
process, under DDP, FSDP2, HSDP, a fake world and for the weight-ownership mode's owned
matrices alike. AdamW is torch's own implementation. This class keeps torch.optim's
contract (param groups, ``self.state``, ``state_dict``); its parts live in modules of one
purpose each: :mod:`dmuon.params` (names, matrix views and routing reasons, followed through
replaced parameter objects), :mod:`dmuon.runtime_builder` (placements, layouts, the typed
options and the runtime), :mod:`dmuon.engine_step` (the Muon part of a step),
:mod:`dmuon.adamw_steps` (the AdamW part), :mod:`dmuon.state_checks` (checkpoints and the
state a step touches). A step waits for two collectives with several ranks: the engine's
start agreement (structure, every rank's checks, NaN/Inf) and its result agreement.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from dmuon import adamw_steps, engine_step, rank_agreement, runtime_builder, torn_state
from dmuon.backward_step import BackwardStep
from dmuon.config import Execution, MuonMath, merge_flat
from dmuon.engine_step import NonFiniteGradientError
from dmuon.group_options import (ADAMW_OPTION_NAMES, COUNTER_KEYS, as_adamw_group, check_adamw_group,
                                 check_muon_group, check_unknown_keys)
from dmuon.ownership import find_ownership, ownership_of
from dmuon.normuon import normuon_state_like
from dmuon.param_groups import check_names_recorded, initial_groups, named_entries, resolve_adamw_keys
from dmuon.params import ParamInfo, ParamRegistry, route_group
from dmuon.qk_clip import QKClip
from dmuon.routing import MatrixView
from dmuon.routing_summary import RoutingSummary, announce, entries_of
from dmuon.split_options import SPLIT_DEFAULTS, split_view
from dmuon.state_checks import check_state_dict, keep_float32_moments
from dmuon.torn_state import TornStateError, TornStep, first_line

__all__ = ["DMuon", "NonFiniteGradientError", "TornStateError"]


class DMuon(torch.optim.Optimizer):
    """Muon (orthogonalized momentum) for weight matrices and AdamW for the rest.

    ``params``: an ``nn.Module`` (routed automatically, :mod:`dmuon.routing`), tensors or
    ``(name, tensor)`` pairs (``ndim ≥ 2`` → Muon), or param-group dicts with
    ``use_muon=True/False`` and any group option. Options (docs/configuration.md): ``lr``
    and decoupled ``weight_decay`` (group keys); ``math``: a :class:`dmuon.MuonMath` (its
    fields are group keys too); ``execution``: a :class:`dmuon.Execution`; the AdamW part's
    ``adamw_lr`` (default ``lr``), ``adamw_betas``, ``adamw_eps``, ``adamw_weight_decay``
    (default ``weight_decay``); ``process_group``: the group of replicated (DDP) parameters,
    checked equal at construction ("local": every rank trains its own model); DTensor
    parameters (FSDP2, TP) use their mesh. Each matrix is orthogonalized once, on an owner
    rank the planner chose. torch's conventions hold: frozen parameters stay (and train once
    unfrozen); ``momentum`` is a key of every group (AdamW's β1) and of ``defaults``, for
    schedulers that cycle it; ``load_state_dict`` checks the whole checkpoint and a step
    everything it touches before anything is written. A step that fails after this rank
    began writing (a rank lost mid-step) leaves the state torn: ``torn_step`` says where,
    and ``step()``, ``state_dict()`` and ``dmuon.checkpoint.save`` raise `TornStateError`
    until ``load_state_dict`` (dmuon.torn_state).
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
        math, execution = merge_flat(math, execution, flat)
        if qk_clip is not None and not isinstance(qk_clip, QKClip):
            raise TypeError(f"qk_clip must be a dmuon.QKClip or None, got {type(qk_clip).__name__}")
        if isinstance(process_group, str) and process_group != rank_agreement.LOCAL:
            raise ValueError(f"process_group must be None (the default group), a ProcessGroup or "
                             f"{rank_agreement.LOCAL!r} (every rank trains its own model), got {process_group!r}")
        self.qk_clip = qk_clip  # MuonClip's QK-clip, run after every applied step (dmuon/qk_clip.py)
        self.math, self.execution, self.nonfinite = math, execution, execution.nonfinite
        self._runtime_options = execution.runtime_options()  # keywords of dmuon._C.engine.RuntimeOptions
        self._process_group = process_group
        self._runtime = None
        self._runtime_split: tuple | None = None  # split_key the runtime was built with
        self._backward = BackwardStep(self)  # the step begun inside backward (dmuon.backward_step)
        self._adamw_device_steps = adamw_steps.DeviceSteps()
        self._backward_step_on = False
        self._schedules: dict[int, tuple[tuple, Any]] = {}  # group index → (schedule key, NsSchedule)
        self._muon_defaults = dict(lr=lr, weight_decay=weight_decay, **math.as_dict(), **SPLIT_DEFAULTS)
        self._adamw_defaults = dict(lr=lr if adamw_lr is None else adamw_lr,
                                    weight_decay=weight_decay if adamw_weight_decay is None else adamw_weight_decay,
                                    betas=adamw_betas, eps=adamw_eps)
        # Options are checked under the names they were given by (adamw_betas, adamw_eps…).
        check_muon_group(dict(self._muon_defaults), "")
        check_adamw_group(dict(self._adamw_defaults), "", names=ADAMW_OPTION_NAMES)
        self._params = ParamRegistry()
        self._ownership = None
        self._signature: tuple | None = None  # (split_key, structure signature, its lines)
        self._verified_state: dict[int, tuple] = {}  # id(param) → ids of its state tensors checked
        self._group = None  # the Muon parameters' process group (None: one process)
        self._placement_cache = None  # (ids of the Muon parameters, their placements, the group)
        self._engine_groups: dict[tuple, Any] = {}  # ranks → the runtime's own group (runtime_builder)
        self._torn: TornStep | None = None  # the step that failed after this rank began writing
        initial = initial_groups(params, muon_filter, {"lr": adamw_lr, "weight_decay": adamw_weight_decay})
        self._routed = {key: ParamInfo(r.name, r.view if r.use_muon else None, r.reason, tuple(r.param.shape))
                        for key, r in initial.routes.items()}
        # NOTE: torch's OneCycleLR/CyclicLR cycle momentum when `defaults` has it.
        super().__init__(initial.groups, {"lr": lr, "momentum": math.momentum})
        del self._routed
        self.register_state_dict_pre_hook(lambda opt: opt._follow_params())
        runtime_builder.check_ranks_agree(self)
        runtime_builder.check_replicas(self)
        self._ownership = find_ownership(self)
        if isinstance(params, nn.Module) and execution.backward_step is not False:
            self._backward.attach(params)
        announce(self.routing_summary(), not dist.is_initialized() or dist.get_rank() == 0)

    # ----------------------------------------------------------------- parameters
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Fill a group's options from the Muon or AdamW defaults and validate them. Without
        ``use_muon``, the group is routed (by names for (name, tensor) pairs, else by shape)
        and must be all Muon or all AdamW."""
        group, group_idx = dict(param_group), len(self.param_groups)
        if "params" not in group:
            raise ValueError(f"param group {group_idx} has no 'params'")
        routed = getattr(self, "_routed", {})
        entries, named = named_entries(group, group_idx)
        check_names_recorded(self.param_groups, named, group_idx, entries)
        tensors, infos, use_muon = route_group(entries, group_idx,
                                               lambda p: routed.get(id(p)) or self._params.info(p),
                                               None if "use_muon" not in group else bool(group["use_muon"]))
        group["use_muon"] = group.get("use_muon", use_muon)
        resolve_adamw_keys(group, group_idx)
        check_unknown_keys(group, group_idx, use_muon)
        for key, value in (self._muon_defaults if use_muon else self._adamw_defaults).items():
            group.setdefault(key, value)
        for key in COUNTER_KEYS:
            group.setdefault(key, 0)
        group["params"] = tensors
        group.pop("param_names", None)
        if named:
            group["param_names"] = [info.name for info in infos]  # NOTE: as torch.optim records them
        where = f"param group {group_idx}{'' if use_muon else ' (AdamW)'}: "
        if use_muon:
            check_muon_group(group, where)
            for info, param in zip(infos, tensors):
                split_view(info.view, param, group, info.name, where)
            runtime_builder.group_schedule(self, group_idx, group)  # NOTE: built once, here
        else:
            check_adamw_group(group, where)
            group = as_adamw_group(group, where)
        super().add_param_group(group)
        self._params.add_group(tensors, infos)
        self._runtime = None  # NOTE: rebuilt (collectively) at the next step
        self._signature = None
        self._backward.forget_params()
        self._group = runtime_builder.placements(self)[1]
        if self._ownership is not None:
            self._ownership = find_ownership(self)

    def _follow_params(self) -> None:
        """Where param_groups hold other parameter objects than seen (a framework replaced
        them): their entries and state follow (dmuon.params), and what was made of the old
        objects (the runtime, the checks' caches) is made again."""
        if self._params.follow(self.param_groups, self.state):
            self._runtime, self._signature, self._placement_cache = None, None, None
            self._verified_state.clear()
            self._backward.forget_params()

    def param_name(self, param: torch.Tensor) -> str:
        """The name DMuon uses for `param` in messages."""
        info = self._params.info(param)
        if info is None:
            self._follow_params()
            info = self._params.info(param)
        return info.name if info is not None else "<unnamed>"

    def matrix_view(self, param: torch.Tensor) -> MatrixView:
        """How Muon sees `param` as matrices (stack, row blocks, transposition), its group's
        split (split_rows, split_heads, split_dim) applied; ValueError naming it when the split does not fit."""
        self._follow_params()
        view = self._params.view(param)
        for g_idx, group in enumerate(self.param_groups):
            if group["use_muon"] and any(p is param for p in group["params"]):
                return split_view(view, param, group, self.param_name(param), f"param group {g_idx}: ")
        return view

    def routing_summary(self) -> RoutingSummary:
        """Parameters and elements per side, every decision with its reason, the AdamW matrices
        by name (str() prints the table; .line() the one line logged at construction)."""
        self._follow_params()

        def reason(p: torch.Tensor, use_muon: bool) -> str:
            info = self._params.info(p)
            return info.reason if info is not None and info.reason is not None else f"param group with use_muon={use_muon}"
        return entries_of(self.param_groups, self.param_name, reason)

    def _muon_params(self) -> list[tuple[int, torch.Tensor]]:
        """(group index, parameter) of every Muon parameter the step runtime handles (the
        owned ones of the weight-ownership mode excluded), in group order."""
        return [(g_idx, p) for g_idx, group in enumerate(self.param_groups) if group["use_muon"]
                for p in group["params"] if ownership_of(p) is None]

    # ----------------------------------------------------------------------- state
    @torch.no_grad()
    def init_state(self) -> None:
        """Creates every state entry a step would create (zeros), without stepping: the
        target structure for loading a checkpoint into a fresh optimizer. NOTE: no collective
        and no counter changes: what it creates follows from the param groups alone (the same
        on every rank), and a step from it computes what a step from no state does."""
        self._follow_params()
        handle = self._ownership
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not group["use_muon"]:
                    adamw_steps.adamw_state(self.state, p)
                elif handle is not None and ownership_of(p) is handle and not handle.is_owner(p):
                    continue  # the owner holds it (materialized() shares it)
                else:
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group.get("normuon") and "normuon_v" not in state:
                        state["normuon_v"] = normuon_state_like(p, self._params.batch_dims(p))

    @property
    def torn_step(self) -> TornStep | None:
        """The step that failed after this rank began writing (its index, phase and error),
        None while the state is whole: dmuon.torn_state."""
        return self._torn

    def state_dict(self, *, torn_ok: bool = False) -> dict[str, Any]:
        """torch's state_dict; raises TornStateError while the state may be torn (torn_step),
        unless `torn_ok` (a post-mortem)."""
        if self._torn is not None and not torn_ok:
            raise TornStateError(self._torn.message("state_dict()"))
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load_state_dict, after checking the whole checkpoint against these param
        groups (structure, options, every state entry's keys, shapes and dtypes): a mismatch
        raises ValueError naming it, and nothing is changed. Floating-point state is cast to
        its parameter's dtype as torch does, except AdamW moments of float16 parameters, which
        stay float32; a torn state (torn_step) is whole again once loaded. NOTE:
        load_state_dict pre-hooks run after the check."""
        self._follow_params()
        check_state_dict(state_dict, self.param_groups, self.param_name,
                         lambda use_muon: dict(self._muon_defaults if use_muon else self._adamw_defaults))
        super().load_state_dict(state_dict)
        for g_idx, group in enumerate(self.param_groups):
            if not group["use_muon"]:
                group = self.param_groups[g_idx] = as_adamw_group(group, f"param group {g_idx} (AdamW): ")
            else:
                group.setdefault("ns_restarts", None)  # NOTE: checkpoints saved before it existed
                for key, value in SPLIT_DEFAULTS.items():
                    group.setdefault(key, value)
                runtime_builder.group_schedule(self, g_idx, group)
            for key in COUNTER_KEYS:
                group.setdefault(key, 0)
        keep_float32_moments(state_dict, self.param_groups, self.state)
        self._signature = None
        torn_state.clear(self)

    # ----------------------------------------------------------------------- step
    @property
    def runtime(self) -> Any:
        """The step runtime (owners, buckets, plan, last step's statistics)."""
        self._follow_params()
        return runtime_builder.ensure_runtime(self)

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

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        torn = self._torn
        # NOTE: a failed collective left the process group broken: raised here, at once. A
        # failure of this rank's own (the step's collectives completed, the other ranks may
        # step on) is this rank's failed check in the next start agreement instead, so that
        # every rank raises naming it (engine_step.step_checks).
        if torn is not None and not torn.agree:
            raise TornStateError(torn.message("step()"))
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._follow_params()
        step_idx = self.param_groups[0]["num_steps"] + 1
        # NOTE: everything this step touches (group options, gradients, state of both halves)
        # is checked before anything is written; the ranks agree that all of them passed and
        # hold the same groups in the step's start agreement, its first collective.
        # NOTE: host ranges for torch.profiler (`bench e2e --profile` sums the "dmuon.*" ones).
        with torch.profiler.record_function("dmuon.step.inputs"):
            checks = self._step_checks()
        try:
            return self._step(runtime_builder.ensure_runtime(self, checks), step_idx, loss, checks)
        except BaseException as error:
            if self.qk_clip is not None:
                self.qk_clip.reset()
            if self._ownership is not None:
                # NOTE: the owned matrices' window closes with the runtime's step; a step that
                # failed before it (every rank raised in the start agreement before the
                # runtime was made) closes it here. Closed already: nothing left to do; a
                # collective that fails here has failed on the way to the error raised.
                with contextlib.suppress(Exception):
                    self._ownership.exchange.end_window(step_idx)
            if torn is not None:
                raise TornStateError(torn.message("step()")) from error
            raise

    def _step_checks(self) -> Any:
        return engine_step.step_checks(self)

    def _step(self, runtime: Any, step_idx: int, loss: Any, checks: Any) -> Any:
        """Every Muon parameter's check, momentum, NS and apply through the engine (the owned
        matrices' too), the AdamW gradients checked in the same pass and start agreement; then
        AdamW; then the result agreement (QK-clip's maxima in it). An error after this rank
        began writing marks the state torn (torn_step)."""
        # NOTE: with several ranks the engine returns before its result agreement, whose host
        # read waits for the device: the AdamW part (its gradients agreed finite already) is
        # enqueued meanwhile, then the results are agreed. A non-finite orthogonalized update
        # still raises on every rank, after the rest of the step, AdamW's part included, was
        # applied.
        defer = runtime.world_size > 1
        try:
            with torch.profiler.record_function("dmuon.step.engine"):
                applied = engine_step.run(self, runtime, step_idx, defer, checks)
        except BaseException as error:
            if runtime.writes_began:
                self._mark_torn(step_idx, "the Muon part (momentum, exchanges, Newton–Schulz, apply)", error)
            raise
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
        adamw_error = None
        try:
            with torch.profiler.record_function("dmuon.step.adamw"):
                for group in self.param_groups:
                    group["num_steps"] += 1
                    active = [p for p in group["params"] if p.grad is not None] if not group["use_muon"] else []
                    if active:
                        self._adamw_group_step(group, active)
        except BaseException as error:
            adamw_error = error
        # NOTE: collective: every rank agrees even when its AdamW part raised.
        try:
            with torch.profiler.record_function("dmuon.step.agree_results"):
                agreed = engine_step.engine_call(runtime.agree_results, clip.local_keys() if folded else [])
        except BaseException as error:
            # NOTE: still set: the agreement did not complete (a collective failed). Clear:
            # every rank agreed that an update was not finite (applied alike everywhere).
            if runtime.writes_began:
                self._mark_torn(step_idx, "the result agreement", error)
            elif adamw_error is not None:
                self._mark_torn(step_idx, "the AdamW part", adamw_error, agree=True)
            raise error from adamw_error
        if adamw_error is not None:
            self._mark_torn(step_idx, "the AdamW part", adamw_error, agree=True)
            raise adamw_error
        if clip is not None:
            try:
                clip.apply(agreed if folded else None)
            except BaseException as error:
                self._mark_torn(step_idx, "QK-clip", error)
                raise
        return loss

    def _mark_torn(self, step_idx: int, phase: str, error: BaseException, agree: bool = False) -> None:
        torn_state.mark(self, TornStep(step_idx, phase, first_line(error), agree))

    def _adamw_group_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        adamw_steps.adamw_group_step(group, params, self.state, self._adamw_device_steps)

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
