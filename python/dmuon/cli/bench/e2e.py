"""`python -m dmuon bench e2e`: the end-to-end training step with each optimizer.

A model (a Hugging Face decoder from its config with random weights, or dmuon's small GPT:
see e2e_models) is wrapped by FSDP2 — fully_shard on every decoder layer, then the root —
with bf16 mixed precision on GPUs (parameters gathered in bfloat16, gradients reduced in
float32; float32 throughout on CPUs), and trained on random tokens. Each optimizer
(e2e_optimizers) gets a fresh model from the same seed; its step (forward, backward,
optimizer step, zero_grad; every rank synchronized) is timed after warm-up steps, and the
table reports the median with the difference from AdamW in percent.

`--micro-batch auto` sizes the per-rank batch on GPUs: two probe runs (micro-batch 1 and
2, with AdamW, whose state is the largest) give the memory per sequence, which predicts
the largest micro-batch within 90% of the GPU; the ranks agree on the smallest prediction;
if any optimizer then runs out of memory, every rank agrees on it, drops to a smaller
micro-batch and starts over (descending search). A rank that runs out alone inside a step
leaves the others in a collective that cannot complete: it reports itself, the others are
stopped, and the run restarts in fresh processes at the next smaller micro-batch.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from pathlib import Path

import torch

from dmuon.cli.bench.e2e_setup import (backward_step_on, build_sharded, check_args, early_ns_share, micro_batch_arg,
                                       mixed_precision, random_tokens, torch_device)
from dmuon.cli.bench.environment import environment_line, write_json
from dmuon.cli.bench.fake_world import add_fake_world_arguments
from dmuon.cli.bench.memory import peak, release, reset_peak, sync

# NOTE: the share of GPU memory the predicted micro-batch may fill: the allocator's
# fragmentation and NCCL's buffers live outside what the probes measure.
_MEMORY_BUDGET = 0.90


def register(subparsers) -> None:
    from dmuon.cli.bench.e2e_models import MODEL_NAMES
    from dmuon.cli.bench.e2e_optimizers import OPTIMIZERS

    parser = subparsers.add_parser("e2e", aliases=["train"],
                                   help="end-to-end training step (FSDP2): dmuon (both modes) vs gather vs AdamW")
    parser.add_argument("--model", required=True, choices=MODEL_NAMES,
                        help="a shipped config (Hugging Face transformers, random weights) or 'tiny' (dmuon's GPT)")
    parser.add_argument("--world", default=None,
                        help="processes: N, or 'auto' = every GPU (2 CPU processes without CUDA); default auto")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--micro-batch", default="auto",
                        help="sequences per rank per step: N, or 'auto' = the largest that fits (GPUs; 1 on CPUs)")
    parser.add_argument("--max-micro-batch", type=int, default=64, help="upper bound of the auto search")
    parser.add_argument("--optimizers", default="dmuon,gather,adamw",
                        help=f"comma-separated, from {','.join(OPTIMIZERS)}")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per optimizer (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (allocation, plan, profiling)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is killed")
    parser.add_argument("--backward-step", choices=("auto", "on", "off"), default="auto",
                        help="DMuon's step begun inside backward (Execution.backward_step; auto: the library's default, off)")
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="DMuon's Execution.bucket_size_mb (wire MiB per pipeline stage; default its default)")
    parser.add_argument("--order", choices=("turns", "sequential"), default=None,
                        help="with --fake-world: 'turns' (default) = every optimizer's model alive at once, one step "
                             "of each in turn; 'sequential' = one optimizer after the other (one model in memory)")
    parser.add_argument("--profile", action="store_true",
                        help="with --fake-world: one more step of each optimizer under torch.profiler, summarized "
                             "per phase (device idle gaps, DMuon's hooks, host waits, top operators)")
    add_fake_world_arguments(parser, rank_choice=False)
    parser.set_defaults(func=run)


# --------------------------------------------------------------------- collective bits
# NOTE: seconds a rank waits for the others to reach an agreement (below NCCL's 120 s
# watchdog, so that the cause is reported before the stuck rank is killed).
_AGREE_TIMEOUT_S = 90.0
# NOTE: seconds the other ranks get to finish once one has failed: they wait in a
# collective the failed rank never joins, and NCCL's watchdog would take 120 s more.
_ABORT_AFTER_FAILURE_S = 10.0
# The agreement failure of a rank that ran out of memory alone (_Run.any_rank's message).
_LONE_OUT_OF_MEMORY = re.compile(r"this rank ran out of GPU memory \(\S+ at micro-batch (\d+),")


def _out_of_memory(fn) -> bool:
    """Run fn(); True if it ran out of GPU memory.
    NOTE: the exception (and with it the frames that hold activations) is dropped here, so
    the memory is free once the caller deletes the model. Ranks that run out together (same
    model, same batch size) agree on a smaller micro-batch; a rank that runs out alone leaves
    the others in a collective, and the agreement's timeout (_Run.any_rank) reports it."""
    try:
        fn()
        return False
    except torch.cuda.OutOfMemoryError:
        return True


# ------------------------------------------------------------------------ the worker
class _Run:
    """One rank's view of the benchmark: mesh, model spec, settings."""

    def __init__(self, rank: int, world: int, config: dict) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from dmuon.cli.bench.e2e_models import model_spec
        from dmuon.cli.bench.e2e_optimizers import Settings

        self.rank, self.world, self.config = rank, world, config
        self.device = config["device"]
        self.torch_device = torch_device(self.device)
        self.mesh = init_device_mesh(self.device, (world,))
        self.spec = model_spec(config["model"], config["seq"])
        self.settings = Settings(device_type=self.device,
                                 backward_step={"on": True, "off": False}.get(config.get("backward_step", "auto")),
                                 bucket_size_mb=config.get("bucket_mb"))
        self.mp_policy = mixed_precision(self.device)
        self.param_counts: dict | None = None
        self.control = torch.distributed.new_group(backend="gloo")
        self.agree_timeout_s = float(config.get("agree_timeout_s", _AGREE_TIMEOUT_S))

    def agree(self, value: int, op, failure: str) -> int:
        """all_reduce of one integer over the control group; a RuntimeError naming this rank
        and `failure` when the other ranks do not come within agree_timeout_s.
        NOTE: its own Gloo group with a timeout: a rank that ran out of memory inside a step
        skipped some of FSDP2's collectives, and on the default NCCL group its all-reduce
        would pair with another rank's pending all-gather and hang both."""
        import datetime

        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        work = dist.all_reduce(t, op=op, group=self.control, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(seconds=self.agree_timeout_s))
        except RuntimeError as error:
            raise RuntimeError(f"rank {self.rank}: {failure}") from error
        return int(t.item())

    def any_rank(self, flag: bool, what: str) -> bool:
        """True on every rank if `flag` (ran out of memory) is True on any."""
        import torch.distributed as dist

        cause = f"this rank ran out of GPU memory ({what}, seq {self.config['seq']}) and " if flag else ""
        return bool(self.agree(int(flag), dist.ReduceOp.MAX,
                               f"{cause}the other ranks did not reach the out-of-memory agreement within "
                               f"{self.agree_timeout_s:.0f} s; a rank that runs out inside a step skips collectives "
                               "the others wait in (memory can differ by rank, e.g. in owner mode): pass a smaller "
                               "--micro-batch"))

    def min_over_ranks(self, value: int) -> int:
        import torch.distributed as dist

        return self.agree(value, dist.ReduceOp.MIN,
                          f"the ranks did not agree on the micro-batch within {self.agree_timeout_s:.0f} s")

    def build(self, name: str):
        """A fresh model (same seed on every rank and for every optimizer), prepared,
        sharded (each decoder layer, then the root) and its optimizer."""
        model, opt, counts, owned = build_sharded(self.spec, name, self.mesh, self.mp_policy, self.torch_device,
                                                  self.settings, self.config["seed"])
        self.param_counts = self.param_counts or counts
        return model, opt, owned

    def train(self, name: str, micro_batch: int, num_steps: int, warmup: int) -> dict | None:
        """Time `num_steps` steps after `warmup` with a fresh model; None (on every rank)
        if any rank ran out of memory."""
        import torch.distributed as dist

        state: dict = {}
        release(self.device)
        reset_peak(self.device)

        def build():
            state["model"], state["opt"], state["owned"] = self.build(name)
            state["tokens"] = random_tokens(self.spec, micro_batch, self.config["seq"], self.config["seed"], self.rank,
                                            self.torch_device)

        times: list[tuple[float, float, float]] = []

        def step():
            model, opt, tokens = state["model"], state["opt"], state["tokens"]
            # NOTE: on GPUs, events split forward+backward from the optimizer step without a
            # sync between them; the event after backward follows FSDP2's last reduce-scatter
            # (backward ends by making the current stream wait for it).
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if self.device == "cuda" else None
            dist.barrier()
            sync(self.device)
            start = time.perf_counter()
            if events:
                events[0].record()
            loss = self.spec.loss(model, tokens)
            loss.backward()
            if events:
                events[1].record()
            mid = time.perf_counter()
            opt.step()
            owned = state["owned"]
            if owned is not None and self.device == "cpu":
                state.setdefault("hidden", []).append(hidden_fraction(owned.timeline()))
            elif backward_step_on(opt):
                state.setdefault("hidden", []).append(early_ns_share(opt.runtime.last_stats))
            opt.zero_grad(set_to_none=True)
            if events:
                events[2].record()
            sync(self.device)
            end = time.perf_counter()
            if events:
                split = (events[0].elapsed_time(events[1]) / 1e3, events[1].elapsed_time(events[2]) / 1e3)
            else:
                split = (mid - start, end - mid)
            times.append((end - start, *split))
            state["loss"] = float(loss.detach())

        failed = self.any_rank(_out_of_memory(build), f"{name} at micro-batch {micro_batch}")
        for _ in range(warmup + num_steps):
            if failed:
                break
            failed = self.any_rank(_out_of_memory(step), f"{name} at micro-batch {micro_batch}")
        result = None
        if not failed:
            timed = times[warmup:]
            result = {"step_s": statistics.median(t[0] for t in timed),
                      "fwd_bwd_s": statistics.median(t[1] for t in timed),
                      "opt_s": statistics.median(t[2] for t in timed),
                      "peak_bytes": peak(self.device), "loss": state["loss"],
                      "hidden": statistics.median(state["hidden"][warmup:]) if state.get("hidden") else None,
                      "backward_step": backward_step_on(state["opt"])}
            if not math.isfinite(state["loss"]):
                raise FloatingPointError(f"{name}: loss is {state['loss']} after {warmup + num_steps} steps")
        state.clear()
        release(self.device)
        return result

    def predict_micro_batch(self) -> tuple[int, dict]:
        """The largest micro-batch predicted to fit: peak memory at 1 and 2 sequences (two
        steps each, so the optimizer state exists) extrapolated to the GPU's budget."""
        from dmuon.cli.bench.e2e_optimizers import PROBE_OPTIMIZER

        cap = self.config["max_micro_batch"]
        if self.device != "cuda":
            return 1, {"note": "CPU: micro-batch 1 (no memory search on CPUs)"}
        release(self.device)
        free, _ = torch.cuda.mem_get_info()
        budget = _MEMORY_BUDGET * (free + torch.cuda.memory_reserved())
        peaks = {}
        for b in (1, 2):
            result = self.train(PROBE_OPTIMIZER, b, num_steps=1, warmup=1)
            if result is None:
                if b == 1:
                    raise RuntimeError(f"--model {self.spec.name} does not fit at micro-batch 1, seq "
                                       f"{self.config['seq']} on {self.world} GPU(s)")
                return 1, {"peak_bytes": peaks, "budget_bytes": budget, "note": "micro-batch 2 ran out of memory"}
            peaks[b] = result["peak_bytes"]
        per_sequence = max(1, peaks[2] - peaks[1])
        # NOTE: activations grow with the micro-batch alike for every optimizer, but the
        # optimizers' own peaks differ, and by rank: owner mode holds whole matrices and the
        # Newton–Schulz workspace on their owners. Each other optimizer's peak at one sequence
        # gives its fixed part; the largest one sizes the batch.
        fixed_by_optimizer = {PROBE_OPTIMIZER: peaks[1] - per_sequence}
        for name in self.config["optimizers"]:
            if name in fixed_by_optimizer:
                continue
            result = self.train(name, 1, num_steps=1, warmup=1)
            if result is None:
                raise RuntimeError(f"{name}: --model {self.spec.name} does not fit at micro-batch 1, seq "
                                   f"{self.config['seq']} on {self.world} GPU(s)")
            fixed_by_optimizer[name] = result["peak_bytes"] - per_sequence
        fixed = max(fixed_by_optimizer.values())
        predicted = int(max(1, min(cap, (budget - fixed) // per_sequence)))
        agreed = self.min_over_ranks(predicted)
        return agreed, {"peak_bytes": peaks, "budget_bytes": budget, "per_sequence_bytes": per_sequence,
                        "fixed_bytes": fixed_by_optimizer, "predicted": predicted}


def _next_smaller(micro_batch: int) -> int:
    return max(1, min(micro_batch - 1, int(micro_batch * 0.85)))


def _worker(rank: int, world: int, config: dict) -> dict:
    run_ = _Run(rank, world, config)
    fixed, restart = config["micro_batch"], config.get("restart_micro_batch")
    if fixed:
        micro_batch, probe = fixed, {}
    elif restart:
        micro_batch, probe = restart, {"note": f"restarted at {restart} after a rank ran out of memory alone"}
    else:
        micro_batch, probe = run_.predict_micro_batch()
    out_of_memory_at = list(config.get("out_of_memory_at", []))
    while True:
        results = {}
        for name in config["optimizers"]:
            results[name] = run_.train(name, micro_batch, config["steps"], config["warmup"])
            if results[name] is None:
                break
        if all(r is not None for r in results.values()):
            break
        out_of_memory_at.append(micro_batch)
        if fixed or micro_batch == 1:
            raise RuntimeError(f"{name} ran out of memory at micro-batch {micro_batch} (seq {config['seq']}); "
                               f"{'try a smaller --micro-batch' if fixed else 'the model does not fit'}")
        micro_batch = _next_smaller(micro_batch)
    return {"micro_batch": micro_batch, "probe": probe, "out_of_memory_at": out_of_memory_at,
            "param_counts": run_.param_counts, "optimizers": results}


# ------------------------------------------------------------------------- reporting
def hidden_fraction(events: list) -> float | None:
    """Share of the owners' Newton–Schulz time (ns_begin → ns_end per bucket) that lies
    before the end of backward (its first flush). NOTE: host times: exact on CPUs, where the
    worker thread computes; on GPUs they time enqueueing, so the benchmark reports it for
    CPU runs only."""
    end = next((e.seconds for e in events if e.what == "flush"), None)
    begins = {e.index: e.seconds for e in events if e.what == "ns_begin"}
    total = hidden = 0.0
    for e in events:
        if e.what == "ns_end" and e.index in begins:
            total += e.seconds - begins[e.index]
            if end is not None:
                hidden += max(0.0, min(e.seconds, end) - begins[e.index])
    return hidden / total if total > 0 else None


def _slowest(results: dict) -> dict:
    """Per optimizer, the slowest rank's medians and the largest peak."""
    names = list(results[0]["optimizers"])
    merged = {}
    for name in names:
        per_rank = [r["optimizers"][name] for r in results.values()]
        merged[name] = {key: max(e[key] for e in per_rank) for key in ("step_s", "fwd_bwd_s", "opt_s", "peak_bytes")}
        merged[name]["loss"] = per_rank[0]["loss"]
        hidden = [e["hidden"] for e in per_rank if e.get("hidden") is not None]
        merged[name]["hidden"] = min(hidden) if hidden else None
        merged[name]["hidden_per_rank"] = [e.get("hidden") for e in per_rank]
        merged[name]["backward_step"] = any(e.get("backward_step") for e in per_rank)
    return merged


def _print_table(merged: dict, context: dict) -> None:
    header = (f"{'optimizer':<15} {'step ms':>9} {'fwd+bwd ms':>11} {'opt step ms':>12} {'tokens/s':>11} "
              f"{'peak GB':>8} {'loss':>7} {'vs AdamW':>9}")
    print(header)
    print("-" * len(header))
    adamw = merged.get("adamw", {}).get("step_s")
    tokens = context["world"] * context["micro_batch"] * context["seq"]
    for name, e in merged.items():
        versus = f"{(e['step_s'] - adamw) / adamw * 100:+8.2f}%" if adamw else f"{'-':>9}"
        print(f"{name:<15} {e['step_s'] * 1e3:9.1f} {e['fwd_bwd_s'] * 1e3:11.1f} {e['opt_s'] * 1e3:12.1f} "
              f"{tokens / e['step_s']:11,.0f} {e['peak_bytes'] / 1e9:8.2f} {e['loss']:7.3f} {versus}")
    for name, e in merged.items():
        if e.get("hidden") is not None:
            what = ("matrices ran before backward ended (step begun from backward; median step)"
                    if e.get("backward_step") else
                    "time ran before backward ended (median step; from the runtime's timeline)")
            shares = ", ".join(f"rank {r} {h * 100:.0f}%" for r, h in enumerate(e["hidden_per_rank"]) if h is not None)
            print(f"{name}: share of the owners' Newton–Schulz {what}: {shares}")
            if e.get("backward_step") and context["world"] == 1:
                # NOTE: one rank holds every matrix whole: no exchange to hide.
                print(f"{name}: world 1: the NS begun from backward runs on this device inside backward "
                      "(fwd+bwd grows by about what the opt step loses; nothing is exchanged)")
    print("step: forward + backward + optimizer step + zero_grad, every rank synchronized (slowest rank's median); "
          "fwd+bwd and opt step: the same steps split by CUDA events (CPU: by the clock); vs AdamW: step time difference")
    print(flush=True)


def _count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _launch_until_it_fits(config: dict, world: int, timeout_s: float, worker=None) -> dict:
    """The ranks' results of `worker` (default _worker); restarted at a smaller micro-batch
    (auto only) while a rank runs out of memory alone, which leaves the others stuck in a
    collective until they are stopped."""
    from dmuon.cli.launch import RankFailed, launch

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return launch(worker or _worker, world, config, backend="nccl" if config["device"] == "cuda" else "gloo",
                          timeout_s=max(1.0, deadline - time.monotonic()),
                          abort_after_failure_s=config.get("abort_after_failure_s", _ABORT_AFTER_FAILURE_S))
        except RankFailed as error:
            match = _LONE_OUT_OF_MEMORY.search(str(error))
            at = int(match.group(1)) if match else None
            if at is None or config["micro_batch"] is not None or at == 1:
                raise
            smaller = _next_smaller(at)
            print(f"a rank ran out of memory alone at micro-batch {at}; restarting every rank at {smaller}",
                  flush=True)
            config = {**config, "restart_micro_batch": smaller,
                      "out_of_memory_at": [*config.get("out_of_memory_at", []), at]}


def run(args: argparse.Namespace) -> int:
    from dmuon.cli.bench.e2e_optimizers import OPTIMIZERS, parse_optimizers
    from dmuon.cli.launch import resolve_device, resolve_world

    from dmuon.cli.usage import input_checks

    if args.fake_world is not None:
        from dmuon.cli.bench.e2e_fake import run_fake

        return run_fake(args)
    with input_checks():
        for flag, value, why in (("--rank", args.rank, "a real --world runs every rank"),
                                 ("--hsdp", args.hsdp if args.hsdp != 1 else None, "a real --world runs every rank"),
                                 ("--order", args.order, "a real --world trains one optimizer after the other"),
                                 ("--profile", args.profile or None, "it profiles the fake rank's step")):
            if value is not None:
                raise ValueError(f"{flag} needs --fake-world ({why})")
        check_args(args)
        device = resolve_device(args.device)
        world = resolve_world("auto" if args.world is None else args.world, device)
        micro_batch = micro_batch_arg(args.micro_batch)
        optimizers = parse_optimizers(args.optimizers)
    config = dict(model=args.model, device=device, seq=args.seq, micro_batch=micro_batch,
                  max_micro_batch=args.max_micro_batch, optimizers=optimizers, steps=args.steps,
                  warmup=args.warmup, seed=args.seed, backward_step=args.backward_step,
                  bucket_mb=args.bucket_mb)

    env = environment_line(device)
    print(f"dmuon bench e2e | {env}", flush=True)
    results = _launch_until_it_fits(config, world, args.timeout)
    first = results[0]
    merged = _slowest(results)
    counts = first["param_counts"]
    precision = "bf16 params / fp32 reduce (FSDP2 MixedPrecisionPolicy)" if device == "cuda" else "fp32"
    print(f"model {args.model}: {_count(counts['total'])} parameters ({_count(counts['muon'])} in "
          f"{counts['muon_matrices']} Muon matrices) | FSDP2: fully_shard per decoder layer + root, {precision} | "
          f"world {world} ({'NCCL' if device == 'cuda' else 'Gloo'}) | seq {args.seq}")
    probe = first["probe"]
    how = "given" if micro_batch else "auto"
    if micro_batch is None and "peak_bytes" in probe and len(probe["peak_bytes"]) == 2:
        p = probe["peak_bytes"]
        how += (f": AdamW probe peaks {p[1] / 1e9:.1f} GB at 1, {p[2] / 1e9:.1f} GB at 2 sequences; "
                f"budget {probe['budget_bytes'] / 1e9:.1f} GB -> {probe['predicted']}")
        if probe.get("fixed_bytes"):
            largest = max(probe["fixed_bytes"], key=probe["fixed_bytes"].get)
            how += f" (largest fixed part: {largest}, {probe['fixed_bytes'][largest] / 1e9:.1f} GB)"
    elif "note" in probe and micro_batch is None:
        how += f": {probe['note']}"
    if first["out_of_memory_at"]:
        how += f"; out of memory at {first['out_of_memory_at']}"
    print(f"micro-batch {first['micro_batch']} per rank ({how}) | median of {args.steps} steps after "
          f"{args.warmup} warm-up | optimizers: " + "; ".join(f"{n} = {OPTIMIZERS[n].description}" for n in optimizers))
    _print_table(merged, dict(world=world, micro_batch=first["micro_batch"], seq=args.seq))
    write_json(args.json, {"environment": env, "config": {**config, "world": world}, "micro_batch": first["micro_batch"],
                           "probe": probe, "out_of_memory_at": first["out_of_memory_at"], "param_counts": counts,
                           "slowest_rank": merged, "per_rank": {str(r): results[r]["optimizers"] for r in results}})
    return 0
