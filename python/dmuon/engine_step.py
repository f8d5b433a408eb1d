"""The Muon part of DMuon's step, through the C++ step engine: this rank's checks (what
the step's start agreement agrees on), the tensors handed to the engine (every Muon
parameter's, the owned matrices' of the weight-ownership mode after them, the AdamW
gradients to check with them), and the state the step made once it applied."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor

from dmuon import distributed, rank_agreement
from dmuon._ops import _C
from dmuon.group_options import check_adamw_group, check_muon_group
from dmuon.normuon import normuon_state_like
from dmuon.ownership import ownership_of
from dmuon.params import split_error
from dmuon.runtime_builder import group_rules
from dmuon.split_options import split_key
from dmuon.state_checks import step_state_error


class NonFiniteGradientError(FloatingPointError):
    """A gradient holds NaN or ±Inf (policy nonfinite='raise')."""


def engine_call(call: Callable[..., Any], *args: Any) -> Any:
    """call(*args) (the runtime's step or agree_results); a momentum buffer holding NaN/Inf
    raises NonFiniteGradientError (the engine refuses the step on every rank, naming it)."""
    try:
        return call(*args)
    except RuntimeError as error:
        if "(corrupt optimizer state)" in str(error):
            raise NonFiniteGradientError(str(error)) from None
        raise


def step_checks(opt: Any) -> Any:
    """This rank's part of the step's start agreement: the param groups' structure (its
    signature and, to name a difference, its lines) and this rank's checks."""
    split = split_key(opt.param_groups)
    if opt._signature is None or opt._signature[0] != split:
        opt._signature = (split, rank_agreement.structure_signature(opt.param_groups),
                          rank_agreement.describe_groups(opt.param_groups, opt.param_name))
    _, signature, describe = opt._signature
    return _C.engine.StepChecks(signature=signature, error=_step_input_error(opt), describe=describe)


def _step_input_error(opt: Any) -> str:
    """Why this rank cannot step ("" if it can): its state may be torn by a failed step, a
    bad group option (a scheduler or the user may have set it), or a gradient or state
    tensor that does not fit its parameter."""
    if opt._torn is not None:
        return opt._torn.message("step()")
    for g_idx, group in enumerate(opt.param_groups):
        try:
            if group["use_muon"]:
                check_muon_group(group, f"param group {g_idx}: ")
            else:
                check_adamw_group(group, f"param group {g_idx} (AdamW): ")
        except ValueError as error:
            return f"{error}; nothing was updated"
    split = split_error(opt.param_groups, opt._params, opt.param_name, lambda p: ownership_of(p) is not None)
    if split:
        return f"{split}; nothing was updated"
    # NOTE: the engine reads a gradient's local tensor as the parameter's box: a DTensor
    # gradient placed otherwise (e.g. Partial, or another shard dim of equal size) would
    # be read as the wrong piece.
    for _, p in opt._muon_params():
        g = p.grad
        if isinstance(p, DTensor) and isinstance(g, DTensor) and (
                tuple(g.placements) != tuple(p.placements) or g.device_mesh != p.device_mesh):
            return (f"the gradient of Muon parameter {opt.param_name(p)!r} is placed {tuple(g.placements)} on "
                    f"{g.device_mesh}, but the parameter {tuple(p.placements)} on {p.device_mesh} (redistribute "
                    "it like the parameter); nothing was updated")
    return step_state_error(opt.param_groups, opt.state, opt.param_name, distributed.local,
                            skip=lambda p: ownership_of(p) is not None, verified=opt._verified_state)


def run(opt: Any, runtime: Any, step_idx: int, defer: bool, checks: Any) -> Any:
    """The engine's step of every Muon parameter (the owned ones after the others), AdamW's
    gradients checked with it: True when applied, else the names of the parameters whose
    gradients were not finite (nothing was written). `defer`: an applied step's result
    agreement is left to runtime.agree_results()."""
    muon = opt._muon_params()
    muon_ids = {id(p) for _, p in muon}
    rules, _ = group_rules(opt)
    params, grads, buffers, row_states = [], [], [], []
    fresh, fresh_v = [], []  # (parameter, new state tensor), stored once the step applied
    normuon_ids = {id(p) for group in opt.param_groups if group["use_muon"] and group.get("normuon", False)
                   for p in group["params"]}
    # Buffers made for a step begun inside backward (the engine holds them already).
    begun = opt._backward.take()
    for i, (_, p) in enumerate(muon):
        params.append(distributed.local(p))
        if p.grad is None:
            grads.append(None)
            buffers.append(None)
            row_states.append(None)
            continue
        # NorMuon's v: one float32 per row of every matrix (rows as the parameter stores them).
        v = opt.state.get(p, {}).get("normuon_v") if id(p) in normuon_ids else None
        if id(p) in normuon_ids and v is None:
            v = normuon_state_like(p, opt._params.view(p).batch_dims)
            fresh_v.append((p, v))
        row_states.append(distributed.local(v) if v is not None else None)
        # NOTE: a buffer enters the state only once a step applied it (a refused step
        # leaves the state as it was).
        buffer = opt.state.get(p, {}).get("momentum_buffer")
        if buffer is None:
            buffer = begun.get(i)
            if buffer is None:
                buffer = torch.zeros_like(p, memory_format=torch.preserve_format)
            fresh.append((p, buffer))
        grads.append(distributed.local(p.grad))
        buffers.append(distributed.local(buffer))
    # The owned matrices: their masters and the owner's momentum buffers (the gradients are
    # the exchange's).
    entries = opt._ownership._entries if opt._ownership is not None else []
    for e in entries:
        params.append(e.master if e.mine else None)
        grads.append(None)
        row_states.append(None)
        buffer = opt.state.get(e.master, {}).get("momentum_buffer") if e.mine else None
        if e.mine and buffer is None and opt._ownership.exchange.contributed(e.index):
            buffer = begun.get(len(muon) + e.index)
            if buffer is None:
                buffer = torch.zeros_like(e.master, memory_format=torch.contiguous_format)
            fresh.append((e.master, buffer))
        buffers.append(buffer)
    # NOTE: every rank passes the same list (an AdamW parameter without a gradient as
    # None), so that the engine's agreement has one size on every rank; it agrees on the
    # gradients' presence too (on some ranks only: an error on every rank naming it).
    others = [p for group in opt.param_groups if not group["use_muon"] for p in group["params"]
              if id(p) not in muon_ids]
    extra = [distributed.local(p.grad) if p.grad is not None else None for p in others]
    outcome = engine_call(runtime.step, params, grads, buffers, rules, step_idx,
                          [opt.param_name(p) for p in others], extra, row_states, defer, checks)
    if not outcome["applied"]:
        stepped = [p for _, p in muon] + [e.master for e in entries]
        bad = {id(stepped[i]) for i in outcome["nonfinite_params"]} | {id(others[k]) for k in outcome["nonfinite_extra"]}
        return [opt.param_name(p) for group in opt.param_groups for p in group["params"] if id(p) in bad]
    for p, buffer in fresh:
        opt.state[p]["momentum_buffer"] = buffer
    for p, v in fresh_v:
        opt.state[p]["normuon_v"] = v
    return True
