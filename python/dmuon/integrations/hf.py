"""DMuon under the Hugging Face ``Trainer``::

    from dmuon.integrations.hf import create_optimizer
    trainer = Trainer(model=model, args=training_args, train_dataset=data)
    create_optimizer(trainer, adamw_lr=3e-3)     # DMuon instead of the Trainer's AdamW
    trainer.train()
    print(trainer.optimizer.routing_summary())

``create_optimizer(trainer)`` makes DMuon the optimizer the Trainer creates itself: at the
moment the Trainer creates its own (after accelerate prepared the model where its FSDP path
needs that), from the model it trains, with the TrainingArguments' ``learning_rate``,
``weight_decay``, ``adam_beta1/2`` and ``adam_epsilon`` (AdamW's betas and eps) unless given;
the Trainer's lr scheduler, clipping, accumulation, checkpoints and resume then work as with
its AdamW. NOTE: the weight decay applies to every parameter DMuon gets (the Trainer's AdamW
exempts biases and norms; with its default ``weight_decay=0.0`` nothing differs).

accelerate wraps the optimizer (``AcceleratedOptimizer``); ``trainer.optimizer`` keeps
answering ``routing_summary()`` through the wrapper, and
``dmuon.integrations.unwrap(trainer.optimizer)`` is the DMuon itself.
``create_optimizer(model, ...)`` returns a DMuon for the model (to pass as
``Trainer(optimizers=(optimizer, None))``).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import Trainer, TrainerCallback

from dmuon.integrations import unwrap
from dmuon.optimizer import DMuon


def _from_arguments(args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """DMuon's keywords: the TrainingArguments' optimizer values where `kwargs` sets none."""
    return {"lr": args.learning_rate, "weight_decay": args.weight_decay,
            "adamw_betas": (args.adam_beta1, args.adam_beta2), "adamw_eps": args.adam_epsilon, **kwargs}


class _RoutingSummaryThroughWrapper(TrainerCallback):
    """At the start of training (the optimizer prepared): routing_summary on accelerate's wrapper."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        wrapper = self.trainer.optimizer
        if wrapper is not None and not isinstance(wrapper, DMuon):
            wrapper.routing_summary = unwrap(wrapper).routing_summary


def create_optimizer(trainer_or_model: Trainer | nn.Module, **dmuon_kwargs: Any) -> DMuon | None:
    """A Trainer: DMuon becomes the optimizer it creates (returns None; it is created in
    ``train()``, or by ``trainer.create_optimizer()``). A model: its DMuon. `dmuon_kwargs`:
    any DMuon keyword (``lr``, ``adamw_lr``, ``math``, ``execution``…)."""
    if isinstance(trainer_or_model, nn.Module):
        return DMuon(trainer_or_model, **dmuon_kwargs)
    trainer = trainer_or_model
    if not isinstance(trainer, Trainer):
        raise TypeError(f"create_optimizer takes a transformers.Trainer or an nn.Module, got "
                        f"{type(trainer).__name__}")
    if trainer.optimizer is not None:
        raise ValueError("create_optimizer: this Trainer has an optimizer already (passed as optimizers=(...)); "
                         "pass none, or pass DMuon(model) there instead")

    def make(model: nn.Module | None = None) -> DMuon:
        if trainer.optimizer is None:
            trainer.optimizer = DMuon(trainer.model if model is None else model,
                                      **_from_arguments(trainer.args, dmuon_kwargs))
        return trainer.optimizer

    # NOTE: the Trainer calls self.create_optimizer(model) where it makes its optimizer
    # (before or after preparing the model); an attribute of the instance takes its place.
    trainer.create_optimizer = make
    trainer.add_callback(_RoutingSummaryThroughWrapper(trainer))
    return None
