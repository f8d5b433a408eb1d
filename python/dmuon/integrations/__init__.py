"""DMuon in the training frameworks users have, one module per framework (each imports its
framework only when imported itself):

- :mod:`dmuon.integrations.torchtitan`: ``DMuonOptimizersContainer`` (torchtitan's
  ``OptimizersContainer`` with DMuon) and ``dmuon_optimizers(...)``, its config;
- :mod:`dmuon.integrations.hf`: ``create_optimizer(trainer_or_model, ...)`` for the Hugging
  Face ``Trainer``;
- :mod:`dmuon.integrations.lightning`: ``configure_optimizers(module, ...)``, Lightning's recipe.

:func:`unwrap` finds the DMuon inside the frameworks' optimizer wrappers (accelerate's
``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``).
"""

from __future__ import annotations

from typing import Any

from dmuon.optimizer import DMuon


def unwrap(optimizer: Any) -> DMuon:
    """The DMuon that `optimizer` is or wraps (``.optimizer`` of accelerate's wrapper,
    ``._optimizer`` of Lightning's); TypeError naming what was found otherwise."""
    seen = optimizer
    for _ in range(8):  # NOTE: wrappers nest a few levels at most
        if isinstance(seen, DMuon):
            return seen
        inner = getattr(seen, "optimizer", None) or getattr(seen, "_optimizer", None)
        if inner is None or inner is seen:
            break
        seen = inner
    raise TypeError(f"{type(optimizer).__name__} is not a DMuon and wraps none (found {type(seen).__name__})")
