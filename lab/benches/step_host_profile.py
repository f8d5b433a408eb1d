"""Host time of one process's DMuon.step on a GPU, by phase and by Python function:

    python3 lab/benches/step_host_profile.py [--model qwen2.5-0.5b] [--steps 20]

The parameters, gradients and optimizer are those of `python -m dmuon bench ns`. Phases
(wall clock, the device synchronized before each step): "lead" from the call to the step
engine's call, "engine" that call (the check, the gated update and the one host wait at its
end), "after" the rest (AdamW, counters); inside the engine its own phase clocks (host
time: "check" includes the start-of-step agreement). Then cProfile over the same steps: the
functions with the most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import dmuon
from dmuon.cli.bench import ns as bench_ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    params = [torch.randn(*((b,) if b > 1 else ()), r, c, device="cuda") * 0.02
              for b, r, c in bench_ns.model_shapes(args.model)]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = dmuon.DMuon(params, lr=0.02, weight_decay=0.0, execution=dmuon.Execution(cost_model="analytic"))
    for _ in range(3):
        opt.step()
    torch.cuda.synchronize()

    # Phases: wrap the optimizer's own methods (instance attributes shadow the class's).
    marks: dict[str, float] = {}

    def wrap(name: str, begin: str, end: str) -> None:
        inner = getattr(opt, name)

        def timed(*a, **k):
            marks[begin] = time.perf_counter()
            out = inner(*a, **k)
            marks[end] = time.perf_counter()
            return out
        setattr(opt, name, timed)

    wrap("_engine_call", "engine0", "engine1")
    totals = dict.fromkeys(("lead", "engine", "after", "step"), 0.0)
    inner = dict.fromkeys(("momentum", "pack", "ns", "apply", "c++ total"), 0.0)
    for _ in range(args.steps):
        marks.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        totals["lead"] += marks["engine0"] - t0
        totals["engine"] += marks["engine1"] - marks["engine0"]
        totals["after"] += t1 - marks["engine1"]
        totals["step"] += t1 - t0
        stats = opt.runtime.last_stats
        for key, value in (("momentum", stats.momentum_s), ("pack", stats.pack_s), ("ns", stats.ns_s),
                           ("apply", stats.apply_s), ("c++ total", stats.total_s)):
            inner[key] += value
    print(f"{args.model}: {len(params)} parameters ({type(opt.runtime).__name__}); host wall per step, ms "
          "(device synchronized before each):")
    print("  " + "  ".join(f"{k} {v / args.steps * 1e3:.3f}" for k, v in totals.items()))
    print("  inside the engine: " + "  ".join(f"{k} {v / args.steps * 1e3:.3f}" for k, v in inner.items()))

    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    for _ in range(args.steps):
        opt.step()
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
