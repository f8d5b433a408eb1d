"""DMuon in torchtitan (0.3.0 and its main branch): ``DMuonOptimizersContainer``, torchtitan's
``OptimizersContainer`` that builds DMuon for the param groups named "DMuon", and
``dmuon_optimizers(...)``, its config, in a torchtitan ``Trainer.Config``::

    from dmuon.integrations.torchtitan import dmuon_optimizers
    config.optimizer = dmuon_optimizers(lr=0.02, adamw_lr=3e-3, weight_decay=0.1)

The container is torchtitan's: its param groups by FQN pattern (``ParamGroupConfig``; groups
may mix "DMuon" with torch's "AdamW"), its lr-scheduler container, gradient clipping and
MoE load-balancing hook work as with AdamW. DMuon takes torchtitan's groups as they come
(``param_names``, ``fused``, ``foreach``, ``lr`` in every group: dmuon.param_groups) and
routes each group's parameters by their names; ``adamw_lr`` in
``optimizer_factory_kwargs_by_name["DMuon"]`` (or in a group) is the AdamW part's lr.

Checkpoints: ``state_dict()`` is torchtitan's flat, FQN-keyed dict (its
``get_flat_optim_state_dict``), so DCP saves and reshards it. Before a first step the state
is made by ``DMuon.init_state()`` instead of torchtitan's zero-gradient step: no step counter
moves, and nothing in it is collective, so a rank that makes it alone cannot block the others.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig
from torchtitan.components.optimizer.utils import (get_flat_optim_state_dict, init_optim_state,
                                                   load_flat_optim_state_dict)

from dmuon.optimizer import DMuon

NAME = "DMuon"


def init_state(optimizer: torch.optim.Optimizer) -> None:
    """The state a step would create, before the first one: DMuon's without a step (every
    rank alike, no counter moved), torchtitan's zero-gradient step for torch's optimizers."""
    if isinstance(optimizer, DMuon):
        optimizer.init_state()
    else:
        init_optim_state(optimizer)


class DMuonOptimizersContainer(OptimizersContainer):
    """torchtitan's OptimizersContainer with "DMuon" among its optimizer names."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        param_groups: list[ParamGroupConfig] = dataclasses.field(default_factory=lambda: [
            ParamGroupConfig(pattern=r".*", optimizer_name=NAME, optimizer_kwargs={"lr": 0.02, "weight_decay": 0.1})])
        """Groups by FQN pattern; "DMuon" routes each of its groups' parameters itself
        (matrices to Muon, embeddings, the output head, norms and biases to AdamW)."""

    @staticmethod
    def _resolve_optimizer_factory(name: str) -> Callable[..., torch.optim.Optimizer]:
        if name == NAME:
            return DMuon
        return OptimizersContainer._resolve_optimizer_factory(name)

    def state_dict(self) -> dict[str, Any]:
        """Flat, FQN-keyed state of every optimizer (state made first where none exists)."""
        result: dict[str, Any] = {}
        for optimizer in self.optimizers:
            init_state(optimizer)
            result.update(get_flat_optim_state_dict(optimizer))
        return result

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # NOTE: the state is made first: loading reads which state tensors to expect from it.
        for optimizer in self.optimizers:
            init_state(optimizer)
            load_flat_optim_state_dict(optimizer, state_dict)


def dmuon_optimizers(lr: float = 0.02, weight_decay: float = 0.1, **dmuon_kwargs: Any) -> DMuonOptimizersContainer.Config:
    """The config of one DMuon over every parameter, as torchtitan's ``default_adamw`` is for
    AdamW: ``lr`` and ``weight_decay`` in the group, any other DMuon keyword (``adamw_lr``,
    ``math``, ``execution``…) once for the optimizer."""
    return DMuonOptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name=NAME,
                                       optimizer_kwargs={"lr": lr, "weight_decay": weight_decay})],
        optimizer_factory_kwargs_by_name={NAME: dict(dmuon_kwargs)})
