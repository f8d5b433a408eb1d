"""Host time of one process's DMuon.step on a GPU, by phase and by Python function:

    python3 lab/benches/step_host_profile.py [--model qwen2.5-0.5b] [--steps 20]

The parameters, gradients and optimizer are those of `python -m dmuon bench ns`. Phases
(wall clock, the device synchronized before each step): "lead" from the call to the
runtime's fused check, "check" the check (it waits for its flags), "between" to the Muon
step, "muon" the runtime's step (it waits for its finite flags at the end), "after" the
rest; with DMUON_GATED_STEP=1 (default) "check" is the gated check-and-update, which waits
for the whole fused update, and inside it the runtime's own host clock gives the time to
its first launch ("prepare"), to its last ("enqueue") and in all ("c++ total"). Then
cProfile over the same steps: the functions with the most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import dmuon
from dmuon.bench import ns as bench_ns


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
    opt = dmuon.DMuon(params, lr=0.02, weight_decay=0.0, cost_model="analytic")
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

    # NOTE: the gated path (DMUON_GATED_STEP=1) runs check and update in its check call and
    # may skip the Muon step (then "muon" is 0 and "between" runs to the end of the step).
    gated = opt.runtime.gated_step
    wrap("_fused_check_and_update" if gated else "_fused_check_codes", "check0", "check1")
    wrap("_muon_step", "muon0", "muon1")
    totals = dict.fromkeys(("lead", "check", "between", "muon", "after", "step"), 0.0)
    # Inside the gated call (MuonRuntime's host clock): to its first launch, to its last, all.
    inner = dict.fromkeys(("prepare", "enqueue", "c++ total"), 0.0)
    for _ in range(args.steps):
        marks.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        muon0, muon1 = marks.get("muon0", t1), marks.get("muon1", t1)
        totals["lead"] += marks["check0"] - t0
        totals["check"] += marks["check1"] - marks["check0"]
        totals["between"] += muon0 - marks["check1"]
        totals["muon"] += muon1 - muon0
        totals["after"] += t1 - muon1
        totals["step"] += t1 - t0
        if gated:
            stats = opt.runtime.last_stats
            inner["prepare"] += stats.host_prepare_s
            inner["enqueue"] += stats.host_enqueue_s
            inner["c++ total"] += stats.total_s
    print(f"{args.model}: {len(params)} parameters, DMUON_GATED_STEP={int(gated)}; host wall per step, ms "
          "(device synchronized before each):")
    print("  " + "  ".join(f"{k} {v / args.steps * 1e3:.3f}" for k, v in totals.items()))
    if gated:
        print("  inside the gated call (from its start): " +
              "  ".join(f"{k} {v / args.steps * 1e3:.3f}" for k, v in inner.items()))

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
