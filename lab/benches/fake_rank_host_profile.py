"""Host time of DMuon's step on one rank of a fake world, by phase:

    python3 lab/benches/fake_rank_host_profile.py --model qwen2.5-7b --world 64 \
        [--narrow 64] [--device cpu|cuda] [--steps 20] [--cprofile]

The model, its FSDP2 sharding over torch's fake process group and its gradients are those
of `python -m dmuon bench e2e --fake-world` (dmuon.cli.bench.e2e_fake: one forward + backward, then
steps on the same gradients). `--narrow K` divides the model's widths (head size, MLP
width, vocabulary) by K and keeps its structure (layers, tensors, their names and kinds):
a step's host work grows with the number of tensors, not their sizes, so a narrow model
shows on a CPU what the step's host side costs at that world size.

Phases, wall clock, the device synchronized before each step (as the bench does after
backward), medians over the steps:
  inputs   step() up to the end of its checks (param groups, gradients, state; agreed in the
           engine's start agreement, inside `engine`);
  prelude  then up to the step engine's call (lists of local tensors, group options);
  engine   that call (on several ranks it returns before its result agreement);
  adamw    DMuon's AdamW part;
  agree    the engine's result agreement (its host read waits for the device);
  after    the rest of step().
NOTE: on a CPU the engine's and the AdamW part's compute run inside their phases (CPU ops
run at once); `--narrow` makes that compute small. `--cprofile` adds the Python functions
with the most own time over the same steps.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time
from typing import Any, Callable

import torch

PHASES = ("inputs", "prelude", "engine", "adamw", "agree", "after")


def narrow_config(model: str, k: int) -> str:
    """Registers `model` with its widths divided by `k` for dmuon.cli.bench.e2e_models; its name."""
    from dmuon.cli.bench import e2e_models

    if k == 1:
        return model
    kind, values = e2e_models.HF_CONFIGS[model]
    heads = values["num_attention_heads"]
    head_dim = values["hidden_size"] // heads
    narrow = dict(values)
    # NOTE: rotary embeddings need an even head size.
    narrow["hidden_size"] = heads * max(2, (head_dim // k) // 2 * 2)
    narrow["intermediate_size"] = max(8, values["intermediate_size"] // k)
    narrow["vocab_size"] = max(64, values["vocab_size"] // k)
    name = f"{model}-narrow{k}"
    e2e_models.HF_CONFIGS[name] = (kind, narrow)
    return name


@contextlib.contextmanager
def phase_marks(opt: Any, marks: dict[str, float]):
    """Timestamps at the phase boundaries of `opt.step()` (instance attributes shadow the
    class's methods)."""

    def stamped(name: str, inner: Callable, first: bool = False) -> Callable:
        def call(*args, **kwargs):
            begin, end = f"{name}0", f"{name}1"
            if not (first and begin in marks):
                marks[begin] = time.perf_counter()
            out = inner(*args, **kwargs)
            marks[end] = time.perf_counter()
            return out
        return call

    # NOTE: the engine's calls (its step, the result agreement) go through
    # dmuon.engine_step.engine_call, a module function: patched there for the step.
    from dmuon import engine_step

    engine_call = engine_step.engine_call

    def engine_or_agree(call: Callable, *args: Any) -> Any:
        name = "agree" if getattr(call, "__name__", "") == "agree_results" else "engine"
        return stamped(name, engine_call)(call, *args)

    engine_step.engine_call = engine_or_agree
    opt._adamw_group_step = stamped("adamw", opt._adamw_group_step, first=True)
    opt._step_checks = stamped("inputs", opt._step_checks)
    try:
        yield
    finally:
        engine_step.engine_call = engine_call
        del opt._adamw_group_step, opt._step_checks


def phase_seconds(marks: dict[str, float], start: float, stop: float) -> dict[str, float]:
    """Each phase's seconds from one step's marks (a phase that did not run: 0)."""
    out = {"inputs": marks["inputs1"] - start, "prelude": marks["engine0"] - marks["inputs1"],
           "engine": marks["engine1"] - marks["engine0"]}
    out["adamw"] = marks["adamw1"] - marks["adamw0"] if "adamw0" in marks else 0.0
    out["agree"] = marks["agree1"] - marks["agree0"] if "agree0" in marks else 0.0
    out["after"] = stop - max(marks[k] for k in ("engine1", "adamw1", "agree1") if k in marks)
    return out


def main() -> None:
    from dmuon.cli.bench.e2e_fake import _FakeRankTrainer
    from dmuon.cli.bench.e2e_models import HF_CONFIGS
    from dmuon.cli.bench.fake_world import ClusterTopology, fake_rank, world_mesh

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-7b", choices=sorted(HF_CONFIGS))
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--narrow", type=int, default=1, help="divide the widths by this (1: the model as it is)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    if args.narrow < 1 or args.world < 2 or args.steps < 1:
        parser.error("--narrow must be >= 1, --world >= 2, --steps >= 1")
    name = narrow_config(args.model, args.narrow)
    config = dict(model=name, device=args.device, seq=args.seq, micro_batch=1, steps=args.steps, warmup=0, seed=0,
                  world=args.world, rank=0, bucket_mb=None, optimizers=["dmuon"], order="turns", profile=False,
                  backward_step_on=False)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    with fake_rank(0, args.world):
        trainer = _FakeRankTrainer("dmuon", config, world_mesh(args.device, args.world, 1), ClusterTopology())
        opt = trainer.opt
        for _ in range(2):  # NOTE: the plan, allocations and (on GPUs) kernel choices
            trainer.step(timed=False)
        trainer.spec.loss(trainer.model, trainer.tokens).backward()
        opt.step()
        rows: list[dict[str, float]] = []
        marks: dict[str, float] = {}
        with phase_marks(opt, marks):
            for _ in range(args.steps):
                marks.clear()
                sync()
                start = time.perf_counter()
                opt.step()
                sync()
                rows.append(phase_seconds(marks, start, time.perf_counter()))
        profiler = None
        if args.cprofile:
            profiler = cProfile.Profile()
            sync()
            profiler.enable()
            for _ in range(args.steps):
                opt.step()
            sync()
            profiler.disable()
        counts = trainer.counts
    total = [sum(r.values()) for r in rows]
    print(f"{name} at fake world {args.world} on {args.device}: {counts['muon_matrices']} Muon matrices, "
          f"{sum(1 for _ in trainer.model.parameters())} parameters; DMuon.step host wall, ms, median of {args.steps}:")
    print("  " + "  ".join(f"{p} {statistics.median(r[p] for r in rows) * 1e3:.3f}" for p in PHASES)
          + f"  | step {statistics.median(total) * 1e3:.3f}")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
