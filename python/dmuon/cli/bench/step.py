"""`python -m dmuon bench step`: the distributed optimizer step on N local processes.

Every rank holds the manifest's Muon matrices as DTensors sharded on dim 0 (FSDP2's
layout: torch.chunk rows per rank, uneven and empty shards included) with random
gradients, made on its own device (one GPU per rank over NCCL, or CPU processes over
Gloo). The same run times dmuon's owner mode, the naive gather-then-compute mode and
torch's fused AdamW on the same parameters, and prints one table per world size: the step
time, its split into momentum, packing, communication wait, Newton–Schulz and apply, the
bytes each rank sent and received, the planner's predicted NS makespan next to the
measured NS, and the speed-up over gather. `--worlds 2,4,8` adds a scaling table.

NOTE: on GPUs the phases of a step overlap and run asynchronously, so the split comes from
extra steps in which the runtime synchronizes the device after each phase (its `profile`
option, as DMUON_PROFILE=1) on a second process group whose NCCL wait() blocks the host
(TORCH_NCCL_BLOCKING_WAIT=1; NCCL's default wait only orders streams, which would leave
the communication time inside the next phase); the step time comes from the normal,
overlapped steps. On the CPU every phase is synchronous and the timed steps give the split.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from dmuon.cli.bench.environment import environment_line, write_json
from dmuon.cli.bench.fake_world import add_fake_world_arguments
from dmuon.cli.bench.memory import release
from dmuon.cli.bench.step_inputs import bench_model, check_counts, dmuon_of, parse_methods, sharded_tensors
from dmuon.cli.bench.timing import wall_steps


def register(subparsers) -> None:
    parser = subparsers.add_parser("step", help="distributed optimizer step: owner vs gather vs AdamW")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a shipped manifest (python -m dmuon plan lists them)")
    source.add_argument("--manifest", help="a JSON manifest or a Hugging Face config.json")
    parser.add_argument("--world", default=None,
                        help="processes: N, or 'auto' = every GPU (2 CPU processes without CUDA); default 2")
    parser.add_argument("--worlds", default=None,
                        help="comma-separated world sizes, one table each plus a scaling table (e.g. 2,4,8); "
                             "on CUDA sizes above the GPU count are skipped with a note; overrides --world")
    parser.add_argument("--mode", default="all", help="'all', or a comma list of owner, gather (AdamW always runs)")
    parser.add_argument("--max-matrices", type=int, default=0,
                        help="use only the first K Muon matrices (0: all); CPU runs need few")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (plan, profiling, allocation)")
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="extra synchronized steps that split the time into phases (default: 3 on GPUs, "
                             "0 on CPUs, whose timed steps are synchronous already)")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="wire MiB per pipeline bucket")
    parser.add_argument("--planner", choices=("milp", "lpt", "round_robin"), default="milp")
    parser.add_argument("--wire-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                        help="dtype of the exchanged updates (auto: bfloat16 on CUDA, float32 on the CPU)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (after each world)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per world size before it is killed")
    add_fake_world_arguments(parser, rank_choice=True)
    parser.set_defaults(func=run)


# ----------------------------------------------------------------------------- inputs
def resolve_worlds(args, device: str) -> tuple[list[int], list[int]]:
    """(world sizes to run, sizes skipped for lack of GPUs) from --worlds or --world."""
    from dmuon.cli.launch import resolve_world

    if args.worlds is None:
        return [resolve_world("2" if args.world is None else args.world, device)], []
    items = [item.strip() for item in str(args.worlds).split(",") if item.strip()]
    if not items:
        raise ValueError(f"--worlds must list world sizes like 2,4,8, got {args.worlds!r}")
    worlds, skipped = [], []
    for item in items:
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"--worlds: {item!r} is not a positive integer (in {args.worlds!r})")
        world = int(item)
        if device == "cuda" and world > torch.cuda.device_count():
            skipped.append(world)
        elif world not in worlds:
            worlds.append(world)
    if not worlds:
        raise ValueError(f"--worlds {args.worlds}: none fits the {torch.cuda.device_count()} visible GPU(s)")
    return worlds, skipped


# ------------------------------------------------------------------------ the worker
def _profiling_mesh(world: int, device: str):
    """A second 1-D mesh over every rank for the synchronized steps; on GPUs its NCCL group
    blocks the host in wait(), so that a profiled step's "comm wait" is the transfer."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    previous = os.environ.get("TORCH_NCCL_BLOCKING_WAIT")
    os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"  # NOTE: read when a process group is made
    try:
        group = dist.new_group(list(range(world)), backend="nccl" if device == "cuda" else "gloo")
    finally:
        if previous is None:
            del os.environ["TORCH_NCCL_BLOCKING_WAIT"]
        else:
            os.environ["TORCH_NCCL_BLOCKING_WAIT"] = previous
    return DeviceMesh.from_group(group, device)


def _on_mesh(t, mesh):
    """The same local rows as a DTensor on another mesh (no copy)."""
    from torch.distributed.tensor import DTensor, Shard

    return DTensor.from_local(t.detach().to_local(), mesh, [Shard(0)], run_check=False, shape=t.shape,
                              stride=t.stride())


def _run_method(method: str, shapes: list, names: list, mesh, rank: int, world: int, options: dict,
                profiling_mesh=None) -> dict:
    """Time one method on fresh parameters and gradients; for dmuon modes also its split."""
    device = options["device"]
    params = [torch.nn.Parameter(t) for t in sharded_tensors(shapes, mesh, rank, world, 0, device)]
    for p, g in zip(params, sharded_tensors(shapes, mesh, rank, world, 1, device)):
        p.grad = g
    if method == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    else:
        opt = dmuon_of(names, params, method, options)
    splits = []

    def step():
        opt.step()
        if method != "adamw":
            s = opt.runtime.last_stats
            splits.append((s.momentum_s, s.pack_s, s.comm_wait_s, s.ns_s, s.apply_s, s.bytes_sent, s.bytes_received))

    # Timed steps; peak memory above what parameters and gradients hold.
    timed = wall_steps(step, options["steps"], options["warmup"], device, barrier=True)
    entry = {"step_s": statistics.median(timed.times), "peak_extra_bytes": timed.peak_extra,
             "first_step_peak_extra_bytes": timed.first_peak_extra}
    if method != "adamw":
        split = [statistics.median(col) for col in zip(*splits[options["warmup"]:])]
        source = "the timed steps" if device == "cpu" else "the timed steps (host time only: not synchronized)"
        entry.update(split_s=split[:5], split_source=source, bytes_sent=int(split[5]),
                     bytes_received=int(split[6]), num_buckets=opt.runtime.num_buckets,
                     pipeline_depth=opt.runtime.last_stats.pipeline_depth,
                     predicted_ns_s=opt.runtime.predicted_makespan_s if method == "owner" else None)
        # The split from extra steps that synchronize after each phase (GPUs by default).
        if profiling_mesh is not None:
            del opt
            profiled_params = [torch.nn.Parameter(_on_mesh(p, profiling_mesh)) for p in params]
            for q, p in zip(profiled_params, params):
                q.grad = _on_mesh(p.grad, profiling_mesh)
            # NOTE: profile: the runtime synchronizes between phases (Execution.profile), for the split.
            opt = dmuon_of(names, profiled_params, method, options, profile=True)
            splits.clear()
            profiled = wall_steps(step, options["profile_steps"], 1, device, barrier=True).times
            entry.update(split_s=[statistics.median(col) for col in zip(*splits[1:])][:5],
                         split_source=f"{options['profile_steps']} synchronized steps"
                         + (" (NCCL wait blocking)" if device == "cuda" else ""),
                         profiled_step_s=statistics.median(profiled))
    del opt, params
    release(device)
    return entry


def _worker(rank: int, world: int, shapes: list, names: list, methods: list, options: dict) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(options["device"], (world,))
    profiling_mesh = _profiling_mesh(world, options["device"]) if options["profile_steps"] > 0 else None
    return {method: _run_method(method, shapes, names, mesh, rank, world, options, profiling_mesh)
            for method in methods}


# ------------------------------------------------------------------------- reporting
def _slowest(results: dict, world: int, methods: list) -> dict:
    """Per method, the slowest rank's figure of every quantity (bytes: the largest)."""
    merged = {}
    for method in methods:
        per_rank = [results[r][method] for r in range(world)]
        entry = {"step_s": max(e["step_s"] for e in per_rank),
                 "peak_extra_bytes": max(e["peak_extra_bytes"] for e in per_rank),
                 "first_step_peak_extra_bytes": max(e["first_step_peak_extra_bytes"] for e in per_rank)}
        if method != "adamw":
            entry.update(split_s=[max(e["split_s"][k] for e in per_rank) for k in range(5)],
                         split_source=per_rank[0]["split_source"],
                         bytes_sent=max(e["bytes_sent"] for e in per_rank),
                         bytes_received=max(e["bytes_received"] for e in per_rank),
                         num_buckets=per_rank[0]["num_buckets"], predicted_ns_s=per_rank[0]["predicted_ns_s"],
                         pipeline_depth=per_rank[0]["pipeline_depth"])
            if "profiled_step_s" in per_rank[0]:
                entry["profiled_step_s"] = max(e["profiled_step_s"] for e in per_rank)
        merged[method] = entry
    return merged


def _print_world(world: int, merged: dict, context: dict) -> None:
    device = context["device"]
    depths = sorted({e["pipeline_depth"] for e in merged.values() if e.get("pipeline_depth")})
    print(f"world {world} ({'NCCL, one GPU per rank' if device == 'cuda' else 'Gloo, CPU processes'})"
          + (f" | pipeline depth {'/'.join(map(str, depths))} buckets (DMUON_PIPELINE_DEPTH)" if depths else ""))
    header = (f"{'method':<14} {'step ms':>9} {'momentum':>9} {'pack':>7} {'comm wait':>10} {'NS':>8} {'apply':>7} "
              f"{'MB sent/rank':>13} {'MB recv/rank':>13} {'buckets':>8} {'peak+ MB':>9} {'1st peak+':>10} {'vs gather':>10} "
              f"{'x AdamW':>8}")
    print(header)
    print("-" * len(header))
    adamw = merged["adamw"]["step_s"]
    gather = merged["gather"]["step_s"] if "gather" in merged else None
    for method, entry in merged.items():
        label = "adamw (fused)" if method == "adamw" else method
        row = f"{label:<14} {entry['step_s'] * 1e3:9.1f} "
        if method == "adamw":
            row += f"{'':>9} {'':>7} {'':>10} {'':>8} {'':>7} {'':>13} {'':>13} {'':>8} "
        else:
            s = [x * 1e3 for x in entry["split_s"]]
            row += (f"{s[0]:9.1f} {s[1]:7.1f} {s[2]:10.1f} {s[3]:8.1f} {s[4]:7.1f} "
                    f"{entry['bytes_sent'] / 2**20:13.2f} {entry['bytes_received'] / 2**20:13.2f} "
                    f"{entry['num_buckets']:8d} ")
        row += f"{entry['peak_extra_bytes'] / 2**20:9.1f} {entry['first_step_peak_extra_bytes'] / 2**20:10.1f} "
        row += f"{gather / entry['step_s']:9.2f}x " if gather else f"{'-':>10} "
        row += f"{entry['step_s'] / adamw:7.2f}x"
        print(row)
    split_source = next((e["split_source"] for e in merged.values() if "split_source" in e), None)
    if split_source:
        extra = ""
        profiled = {m: e["profiled_step_s"] for m, e in merged.items() if "profiled_step_s" in e}
        if profiled:
            extra = " (those steps took " + ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in profiled.items()) + ")"
        print(f"split: median of {split_source}{extra}; step ms: median of {context['steps']} normal steps")
    if "owner" in merged:
        predicted = merged["owner"]["predicted_ns_s"]
        measured = merged["owner"]["split_s"][3]
        ratio = f" ({measured / predicted:.2f}x the prediction)" if predicted > 0 else ""
        print(f"planner's predicted NS makespan ({context['cost_model']}): {predicted * 1e3:.1f} ms; "
              f"measured NS on the slowest rank: {measured * 1e3:.1f} ms{ratio}")
    print(f"peak+ MB: the slowest rank's peak memory during the timed steps above what it held before "
          f"({'CUDA allocator' if device == 'cuda' else 'resident set, VmHWM'}); 1st peak+: the same over the "
          f"warm-up steps, which build the runtime (plan, cost table, tuning, graphs)")
    print(flush=True)


def _print_scaling(worlds: dict, name: str) -> None:
    print(f"scaling: {name} (slowest rank, ms)")
    header = (f"{'world':>5} {'owner':>9} {'gather':>9} {'adamw':>9} {'owner vs gather':>16} {'owner x AdamW':>14} "
              f"{'predicted NS':>13} {'measured NS':>12} {'owner MB sent':>14} {'gather MB sent':>15}")
    print(header)
    print("-" * len(header))
    for world, merged in worlds.items():
        def ms(method, key="step_s"):
            return merged[method][key] * 1e3 if method in merged else float("nan")

        owner, gather, adamw = ms("owner"), ms("gather"), ms("adamw")
        predicted = merged["owner"]["predicted_ns_s"] * 1e3 if "owner" in merged else float("nan")
        measured = merged["owner"]["split_s"][3] * 1e3 if "owner" in merged else float("nan")
        sent = {m: merged[m]["bytes_sent"] / 2**20 if m in merged else float("nan") for m in ("owner", "gather")}
        print(f"{world:>5} {owner:9.1f} {gather:9.1f} {adamw:9.1f} {gather / owner:15.2f}x {owner / adamw:13.2f}x "
              f"{predicted:13.1f} {measured:12.1f} {sent['owner']:14.2f} {sent['gather']:15.2f}")
    print(flush=True)


def run(args: argparse.Namespace) -> int:
    from dmuon.cli.launch import launch, resolve_device

    from dmuon.cli.usage import input_checks

    if args.fake_world is not None or args.fake_mesh is not None:
        from dmuon.cli.bench.step_fake import run_fake

        return run_fake(args)
    with input_checks():
        for flag, value in (("--rank", args.rank), ("--ranks", args.ranks),
                            ("--hsdp", args.hsdp if args.hsdp != 1 else None),
                            ("--memory-budget-gb", args.memory_budget_gb)):
            if value is not None:
                raise ValueError(f"{flag} needs --fake-world (a real --world runs every rank)")
        check_counts(args)
        device = resolve_device(args.device)
        worlds, skipped = resolve_worlds(args, device)
        model = bench_model(args, device)
    profile_steps = args.profile_steps if args.profile_steps is not None else (3 if device == "cuda" else 0)
    methods = parse_methods(args.mode) + ["adamw"]
    context = dict(device=device, steps=args.steps,
                   cost_model="profiled NS cost table" if device == "cuda" else "analytic CPU cost model")
    options = dict(device=device, bucket_mb=args.bucket_mb, planner=args.planner, steps=args.steps,
                   warmup=args.warmup, profile_steps=profile_steps, wire_dtype=args.wire_dtype)

    # Header, then one table per world size as it finishes.
    env = environment_line(device)
    print(f"dmuon bench step | {env}")
    print(model.line(args, "sharded on dim 0 (FSDP2)"))
    if skipped:
        print(f"skipped world sizes {skipped}: only {torch.cuda.device_count()} GPU(s) visible")
    print(flush=True)
    record = {"environment": env, "model": model.name, "num_matrices": len(model.shapes),
              "num_params": model.num_params, "device": device, "wire_dtype": model.wire, "bucket_mb": args.bucket_mb, "planner": args.planner,
              "steps": args.steps, "warmup": args.warmup, "skipped_worlds": skipped, "worlds": {}}
    done = {}
    for world in worlds:
        results = launch(_worker, world, model.shapes, model.names, methods, options,
                         backend="nccl" if device == "cuda" else "gloo", timeout_s=args.timeout)
        done[world] = _slowest(results, world, methods)
        _print_world(world, done[world], context)
        record["worlds"][str(world)] = {"slowest_rank": done[world], "per_rank": {str(r): results[r] for r in results}}
        write_json(args.json, record)
    if len(done) > 1:
        _print_scaling(done, model.name)
    return 0
