"""The sharded step started from backward: hooks that hand a parameter's final
gradient to the step engine as soon as its reduction is done, so that its stage's pieces
travel to their owners, and owners orthogonalize, while backward continues.

Contract (docs/configuration.md, ``Execution.backward_step``):

- backward may start the step; ``optimizer.step()`` completes it (the engine's finish and
  commit: one agreement, then momentum and weights written; nothing is written before).
- Only a backward that reduces gradients starts it: FSDP2 under
  ``set_requires_gradient_sync(False)`` and DDP under ``no_sync()`` reduce nothing, so
  accumulation micro-batches start nothing and the last one (synced) does.
- ``zero_grad()``, or a second synced backward before ``step()``, discards the begun step
  (nothing written; every rank does the same, so collectives stay matched).
- A gradient changed between backward and ``step()`` (``clip_grad_norm_``, a manual
  scale, another tensor): the engine compares the bits of what it read with the gradients
  ``step()`` is given (a fingerprint of each side, read with the step's own checks), and the
  step's start agreement (one collective for everything) makes every rank drop the begun
  work and run the whole step after backward, on the gradients as they are then
  (``runtime.last_stats.begun_stale``).
- The first step of a runtime runs after backward (the runtime is made collectively at
  the first ``step()``).

The stages: the hooks of the backward before the runtime is made record which parameters
each FSDP2 group hands over, in hook order (DDP: none; each matrix a group, the last one
first); the engine forms the stages of runs of whole groups, each of a matrix per rank
(plan/stage_windows.h), so that every stage but the last can leave inside backward
whatever the model's size; the runtime holds the hand-overs until they complete a stage
(one engine call per stage, not per group). Where
the last stage holds more than half the matrices' bytes (one FSDP2 unit for the whole
model), the runtime warns once, naming what to change.

Where the final gradient comes from:
- FSDP2 / HSDP (``fully_shard``): after each FSDP parameter group's post-backward (its
  reduce-scatter and, for HSDP, all-reduce), the sharded parameters' ``.grad``. A group is
  handed over from the next group's post-backward (the root's runs at the end of
  backward), once the compute stream has waited for its reduce-scatter; the last one is
  not handed over: ``step()``'s pipeline steps its matrices (and those of any stage it
  completes).
  NOTE: a wrapper of the group's ``post_backward`` (FSDP2 calls it through the instance);
  FSDP2 exposes no public hook after its reduce-scatter. A wrapper installed there before
  DMuon attaches (e.g. the fake-world benchmark's, dmuon.bench.fake_grads) runs inside
  DMuon's, before the gradients are handed over.
  NOTE: why one group later: the sharded gradients are written on FSDP2's reduce-scatter
  stream (its post-reduce event), and the engine's work on them runs on the compute stream.
  Waiting there for the group just reduced makes backward wait for every reduce-scatter
  (torch 2.11's FSDP2 waits for one only at the next group's post-backward, so that the
  reduce-scatter of layer L runs while layer L-1 computes). Handed over one group later,
  that wait has already been done by FSDP2, and the wait on the post-reduce event adds
  only the group's post-reduce copies (HSDP: its all-reduce, which FSDP2 itself waits for
  only at the end of backward).
- DDP with ``gradient_as_bucket_view=True``: a communication hook (the default all-reduce)
  whose bucket, once its all-reduce completed, holds the parameters' final gradients; a
  bucket is handed over from the next bucket's hook (the autograd thread); the last ones
  are stepped by ``step()``'s pipeline. Without bucket views DDP copies gradients at the end of backward:
  nothing is attached (the step runs after backward).
- The weight-ownership mode (dmuon.own_matrices): each owned matrix's gradient hook begins
  the step (`owned_ready`) and gives the owner's momentum buffer; the exchange hands the
  matrices of each bucket whose reduction arrived to the engine's early work.
All engine calls run on the autograd thread, in the same order on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dmuon import distributed
from dmuon.runtime_builder import group_rules


class BackwardStep:
    """The begun step of one DMuon optimizer (see the module docstring)."""

    def __init__(self, optimizer: Any) -> None:
        self.opt = optimizer
        self.handles: list[Any] = []
        self.attached: list[str] = []  # what was attached ("fsdp2", "ddp")
        # Muon indices handed over (a second synced backward hands one over again)
        self.ready: set[int] = set()
        self.fresh: dict[int, torch.Tensor] = {}  # engine index → zeros buffer made for the begun step
        self.pending: list[tuple[list[torch.Tensor], Any]] = []  # DDP buckets whose all-reduce is in flight
        # FSDP2 groups reduced but not handed over yet: (sharded params, post-reduce event or None, group)
        self.pending_fsdp: list[tuple[list[torch.Tensor], Any]] = []
        self._index: dict[int, int] | None = None
        # id(param) → position of the first FSDP2 group that handed it over in a backward
        # before the runtime was made: the engine's stages are made of them.
        # NOTE: DDP's buckets are not recorded: DDP rebuilds them after its first iteration
        # in the order gradients became ready (measured on torch 2.11: the first backward's
        # one bucket of every parameter, capped at 1 MiB, became one per parameter at
        # bucket_cap_mb=1e-4), so its stages are made per matrix, the last one first.
        self.group_of: dict[int, int] = {}
        self._num_groups = 0
        # NOTE: the Muon parameters, read once per begun step (the groups cannot change
        # inside backward).
        self._muon: list[tuple[int, torch.Tensor]] | None = None

    # ------------------------------------------------------------------ attaching
    def attach(self, model: nn.Module) -> None:
        """Hooks on `model`'s FSDP2 parameter groups, or on `model` when it is a DDP module."""
        from torch.nn.parallel import DistributedDataParallel
        if isinstance(model, DistributedDataParallel):
            if not getattr(model, "gradient_as_bucket_view", False):
                return  # NOTE: gradients final only at the end of backward (see the module docstring)
            model.register_comm_hook(None, self._ddp_hook)
            self.attached.append("ddp")
            return
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # pragma: no cover - torch without FSDP2
            return
        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = module._get_fsdp_state()._fsdp_param_group
            # NOTE: a group wrapped by dmuon already (another DMuon on this model) is left as
            # it is; a wrapper of someone else's is wrapped in turn (it runs first).
            if group is None or getattr(vars(group).get("post_backward"), "_dmuon_backward_step", False):
                continue
            self._wrap_post_backward(group)
            if "fsdp2" not in self.attached:
                self.attached.append("fsdp2")

    def _wrap_post_backward(self, group: Any) -> None:
        original = group.post_backward

        def post_backward(*args: Any) -> Any:
            out = original(*args)
            # NOTE: HSDP under set_requires_all_reduce(False) reduce-scatters only: not final.
            final = group.reduce_grads and (not getattr(group, "_is_hsdp", False) or group.all_reduce_grads)
            # NOTE: nothing is queued (and no stream waits) while no hand-over reaches the
            # engine: before the first step() and with the step kept after backward.
            # NOTE: torch 2.11 runs the post-backward of a unit of several modules
            # (fully_shard([a, b])) twice in a row at the end of backward: once is handed over.
            again = bool(self.pending_fsdp) and self.pending_fsdp[-1][2] is group
            if final and self.hands_over() and not again:
                # NOTE: the group reduced before this one first (see the module docstring).
                self.flush_fsdp()
                self.pending_fsdp.append(([fp.sharded_param for fp in group.fsdp_params],
                                          getattr(group, "_post_reduce_event", None), group))
            elif final and self.opt._runtime is None:
                self.observe([fp.sharded_param for fp in group.fsdp_params])
            return out

        post_backward._dmuon_backward_step = True
        group.post_backward = post_backward

    # NOTE: no annotations: DDP checks them against dist.GradBucket and Future.
    def _ddp_hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        fut = allreduce_hook(state, bucket)
        if self.hands_over():
            # Earlier buckets' all-reduces completed before this one's (one process group, in order).
            self.flush_ddp()
            self.pending.append((list(bucket.parameters()), fut))
        return fut

    def observe(self, params: Any) -> None:
        """Records a group that a backward handed over (see group_of)."""
        new = [id(p) for p in params if id(p) not in self.group_of]
        for key in new:
            self.group_of[key] = self._num_groups
        self._num_groups += bool(new)

    def backward_groups(self) -> list[int]:
        """Each Muon parameter's group position (group_of; -1: never handed over), the
        runtime's RuntimeOptions.backward_groups."""
        return [self.group_of.get(id(p), -1) for _, p in self.opt._muon_params()]

    def flush_fsdp(self) -> None:
        """Hands over the FSDP2 groups reduced and not handed over yet (on GPUs once the
        compute stream has waited for their post-reduce event)."""
        pending, self.pending_fsdp = self.pending_fsdp, []
        for params, event, _ in pending:
            if event is not None:
                torch.cuda.current_stream().wait_event(event)
            self.params_final(params)

    def flush_ddp(self) -> None:
        """Hands over the DDP buckets in flight, after their all-reduce."""
        pending, self.pending = self.pending, []
        for params, fut in pending:
            fut.wait()
            self.params_final(params)

    # ------------------------------------------------------------------ the begun step
    def _muon_index(self) -> dict[int, int]:
        if self._index is None:
            self._index = {id(p): i for i, (_, p) in enumerate(self.opt._muon_params())}
        return self._index

    def forget_params(self) -> None:
        """The Muon parameters changed (added, or their objects replaced: dmuon.params)."""
        self._index = None

    def params_final(self, params: list[torch.Tensor]) -> None:
        """These parameters' gradients are final on this rank: their matrices to the engine.
        NOTE: recorded as a host range for torch.profiler (`bench e2e --profile` sums them)."""
        with torch.profiler.record_function("dmuon.backward_step.params_final"):
            self._params_final(params)

    def owned_ready(self, entry: Any) -> torch.Tensor | None:
        """An owned matrix's gradient is in (weight ownership): once the runtime is made, the
        engine's step is begun (the Muon groups' options now) so that its finished buckets
        start their Newton–Schulz inside backward; returns the owner's momentum buffer for
        that work (None where this rank does not own it, or before the first step)."""
        opt = self.opt
        runtime = opt._runtime
        if runtime is None:
            return None
        if not runtime.step_open:
            group_options, _ = group_rules(opt)
            # NOTE: options a check will refuse at step() (on this rank, every rank then
            # raising in the start agreement): no early work. Its owned matrices' work is
            # this rank's alone, so the others may begin theirs.
            try:
                runtime.begin_step(group_options, opt.param_groups[0]["num_steps"] + 1)
            except RuntimeError:
                return None
        if not entry.mine:
            return None
        buffer = opt.state.get(entry.master, {}).get("momentum_buffer")
        if buffer is None:
            key = len(opt._muon_params()) + entry.index
            buffer = self.fresh.setdefault(key, torch.zeros_like(entry.master, memory_format=torch.contiguous_format))
        return buffer

    def hands_over(self) -> bool:
        """Whether final gradients go to the engine now: its runtime is made (at the first
        step()), the step is begun from backward, and not in the weight-ownership mode."""
        opt = self.opt
        return opt._runtime is not None and opt._backward_step_on and opt._ownership is None

    def _params_final(self, params: list[torch.Tensor]) -> None:
        opt = self.opt
        runtime = opt._runtime
        if not self.hands_over():
            return
        index = self._muon_index()
        idxs = [index[id(p)] for p in params if id(p) in index and p.grad is not None]
        if not idxs:
            return
        if any(i in self.ready for i in idxs):
            self.discard()  # NOTE: a second synced backward before step(): start over
        if not runtime.step_open:
            group_options, _ = group_rules(opt)
            runtime.begin_step(group_options, opt.param_groups[0]["num_steps"] + 1)
        if self._muon is None:
            self._muon = opt._muon_params()
        muon = self._muon
        params, grads, buffers = [], [], []
        for i in idxs:
            p = muon[i][1]
            buffer = opt.state.get(p, {}).get("momentum_buffer")
            if buffer is None:
                buffer = self.fresh.setdefault(i, torch.zeros_like(p, memory_format=torch.preserve_format))
            params.append(distributed.local(p))
            grads.append(distributed.local(p.grad))
            buffers.append(distributed.local(buffer))
            self.ready.add(i)
        # NOTE: the runtime holds them until they start work (a stage complete); its
        # "dmuon.backward_step.engine" host range is the engine's share of this one.
        runtime.params_ready(idxs, params, grads, buffers)

    def take(self) -> dict[int, torch.Tensor]:
        """At step(): the begun step's fresh momentum buffers (by engine index)."""
        with torch.profiler.record_function("dmuon.backward_step.take"):
            return self._take()

    def _take(self) -> dict[int, torch.Tensor]:
        # NOTE: the groups and buckets not handed over yet are dropped (_reset) and stay with
        # step()'s pipeline: handed over here, their stage would leave, and the NS of the
        # stage before it run, only now, as the pipeline does, yet be counted as work begun
        # inside backward.
        runtime = self.opt._runtime
        if runtime is None or not runtime.step_open:
            self._reset()
            return {}
        fresh = self.fresh
        self._reset()
        return fresh

    def discard(self) -> None:
        """Closes the begun step with nothing written."""
        runtime = self.opt._runtime
        if runtime is not None and runtime.step_open:
            runtime.discard()
        self._reset()

    def _reset(self) -> None:
        """Forgets the begun step's hand-overs (the engine's side is closed or taken)."""
        self.ready, self.fresh = set(), {}
        self.pending_fsdp, self.pending = [], []
        self._muon = None
