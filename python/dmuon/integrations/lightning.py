"""DMuon in Lightning: the optimizer ``configure_optimizers`` returns::

    import dmuon.integrations.lightning as dmuon_lightning

    class Model(L.LightningModule):
        def configure_optimizers(self):
            return dmuon_lightning.configure_optimizers(self, lr=0.02, adamw_lr=3e-3,
                                                         scheduler=lambda opt: CosineAnnealingLR(opt, 100))

DMuon is built from the LightningModule (its own routing: matrices to Muon, embeddings, the
output head, norms and biases to AdamW; the parameters as the strategy left them when
``configure_optimizers`` runs: after ``configure_model`` and FSDP2/``ModelParallelStrategy``
sharding). Lightning steps it, clips (``gradient_clip_val``), accumulates, checkpoints and
restores its state. ``dmuon.integrations.unwrap(self.optimizers())`` is the DMuon behind
Lightning's ``LightningOptimizer``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from dmuon.optimizer import DMuon


def configure_optimizers(module: nn.Module, *, scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
                         interval: str = "step", **dmuon_kwargs: Any) -> Any:
    """What ``LightningModule.configure_optimizers`` returns: DMuon over `module` (any DMuon
    keyword in `dmuon_kwargs`), alone, or with ``scheduler(optimizer)`` stepped every
    `interval` ("step" or "epoch")."""
    if interval not in ("step", "epoch"):
        raise ValueError(f"interval must be 'step' or 'epoch', got {interval!r}")
    optimizer = DMuon(module, **dmuon_kwargs)
    if scheduler is None:
        return optimizer
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler(optimizer), "interval": interval}}
