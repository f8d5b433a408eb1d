"""A fake rank's gradients made sane: under torch's fake process group FSDP2's
reduce-scatter moves nothing, so the gradient shards it leaves are uninitialized memory
(NaN/Inf or anything). The benchmark overwrites them with small deterministic random
values, so that the optimizers' NaN/Inf checks pass and their step runs as on real
gradients (the values, and the loss, are garbage either way).

`PostBackwardSanitizer` does it inside FSDP2's post-backward of every parameter group,
right after the group's reduction: installed before the optimizer is built, it runs before
DMuon's backward-step hook of that group (dmuon.backward_step wraps it in turn), so a step
begun from backward reads sane gradients. Benchmark-only: nothing in the library uses it.
"""

from __future__ import annotations

from typing import Any

import torch

# NOTE: gradients are replaced by N(0, σ²) with σ of the order of a real gradient's entries.
SANITIZED_GRAD_STD = 1e-3


def sanitize_gradients(params, generator: torch.Generator) -> None:
    """Every gradient of `params` (its local shard) overwritten by N(0, SANITIZED_GRAD_STD²)."""
    from torch.distributed.tensor import DTensor

    for p in params:
        if p.grad is not None:
            shard = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            shard.normal_(0.0, SANITIZED_GRAD_STD, generator=generator)


class PostBackwardSanitizer:
    """Sanitizes each FSDP2 parameter group's gradients inside its post-backward.

    `log` records, in order, ("sanitized", id(param)) for every parameter whose gradient
    was overwritten (cleared by `clear_log`); tests read it to check the ordering against
    the optimizer's own hook."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.groups = 0
        self.log: list[tuple[str, int]] = []

    def install(self, model: torch.nn.Module) -> None:
        """Wraps the post-backward of every FSDP2 parameter group of `model` (before the
        optimizer is built, so that its hooks run after this one)."""
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                self._wrap(group)
                self.groups += 1

    def _wrap(self, group: Any) -> None:
        original = group.post_backward

        def post_backward(*args: Any) -> Any:
            out = original(*args)
            # NOTE: on GPUs FSDP2 writes the sharded gradients on its post-reduce stream:
            # overwrite them after it (as dmuon.backward_step reads them).
            event = getattr(group, "_post_reduce_event", None)
            if event is not None:
                torch.cuda.current_stream().wait_event(event)
            params = [fp.sharded_param for fp in group.fsdp_params]
            sanitize_gradients(params, self.generator)
            self.log.extend(("sanitized", id(p)) for p in params if p.grad is not None)
            return out

        group.post_backward = post_backward

    def clear_log(self) -> None:
        self.log.clear()
