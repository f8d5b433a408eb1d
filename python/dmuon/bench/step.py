"""`python -m dmuon bench step`: the distributed optimizer step on N local processes.

Every rank holds the manifest's Muon matrices as DTensors sharded on dim 0 (FSDP2's
layout) with random gradients; the same run times dmuon's owner mode, the naive
gather-then-compute mode, and torch's AdamW on the same parameters. The table splits
dmuon's step into momentum, packing, communication wait, Newton–Schulz and apply (the
slowest rank's figures; on GPUs DMUON_PROFILE=1 makes the split exact), with the bytes
each rank sent and the planner's predicted makespan.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dmuon.bench.environment import environment_line


def register(subparsers) -> None:
    parser = subparsers.add_parser("step", help="distributed optimizer step: owner vs gather vs AdamW")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a shipped manifest (python -m dmuon plan lists them)")
    source.add_argument("--manifest", help="a JSON manifest or a Hugging Face config.json")
    parser.add_argument("--world", type=int, default=2, help="processes (GPUs with NCCL when present)")
    parser.add_argument("--mode", choices=("owner", "gather", "all"), default="all")
    parser.add_argument("--max-matrices", type=int, default=0,
                        help="use only the first K Muon matrices (0: all); CPU runs need few")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="wire MiB per pipeline bucket")
    parser.add_argument("--planner", choices=("milp", "lpt", "round_robin"), default="milp")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.set_defaults(func=run)


def _matrices(args) -> list:
    from dmuon.plan.manifest import load_manifest, load_model

    manifest = load_model(args.model) if args.model else load_manifest(args.manifest)
    matrices = list(manifest.matrices)
    if args.max_matrices < 0:
        raise ValueError(f"--max-matrices must be >= 0, got {args.max_matrices}")
    if args.max_matrices:
        matrices = matrices[: args.max_matrices]
    return manifest.name, matrices


def _memory_now(device: str) -> int:
    """Bytes in use: the CUDA allocator's, or this process's resident set (VmRSS)."""
    if device == "cuda":
        return torch.cuda.memory_allocated()
    return _proc_status_kib("VmRSS") * 1024


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return
    try:  # NOTE: writing 5 to clear_refs resets the kernel's peak-RSS counter (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak(device: str) -> int:
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    return _proc_status_kib("VmHWM") * 1024


def _proc_status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return 0


def _time_steps(step, num_steps: int, warmup: int, device: str) -> list[float]:
    import torch.distributed as dist

    times = []
    for i in range(warmup + num_steps):
        dist.barrier()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _worker(rank: int, world: int, shapes: list, modes: list, options: dict) -> dict:
    import dmuon
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    device = options["device"]
    mesh = init_device_mesh(device, (world,))
    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(*shape, generator=gen) / shape[-1] ** 0.5 for shape in shapes]
    results = {}
    for mode in modes + ["adamw"]:
        params = [torch.nn.Parameter(distribute_tensor(t.to(device), mesh, [Shard(0)])) for t in full]
        for p in params:
            p.grad = distribute_tensor(torch.randn_like(p.full_tensor()), mesh, [Shard(0)])
        if mode == "adamw":
            opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
        else:
            opt = dmuon.DMuon([(f"m{i}", p) for i, p in enumerate(params)], lr=1e-3, mode=mode,
                              bucket_size_mb=options["bucket_mb"], planner=options["planner"])
        splits = []

        def step():
            opt.step()
            if mode != "adamw":
                s = opt.runtime.last_stats
                splits.append((s.momentum_s, s.pack_s, s.comm_wait_s, s.ns_s, s.apply_s, s.bytes_sent))

        # Peak extra memory of the steps (above what the parameters and gradients hold).
        before = _memory_now(device)
        _reset_peak(device)
        times = _time_steps(step, options["steps"], options["warmup"], device)
        entry = {"median_s": statistics.median(times), "peak_extra_bytes": max(0, _peak(device) - before)}
        if mode != "adamw":
            timed = splits[options["warmup"]:]
            entry["split"] = [statistics.median(col) for col in zip(*timed)]
            entry["predicted_s"] = opt.runtime.predicted_makespan_s
            entry["num_buckets"] = opt.runtime.num_buckets
        results[mode] = entry
        del opt, params
    return results


def run(args: argparse.Namespace) -> int:
    from dmuon.launch import launch

    if args.world < 1:
        raise ValueError(f"--world must be >= 1, got {args.world}")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    name, matrices = _matrices(args)
    shapes = []
    for m in matrices:
        shapes.append((m.batch, m.rows, m.cols) if m.batch > 1 else (m.rows, m.cols))
    modes = ["owner", "gather"] if args.mode == "all" else [args.mode]
    options = dict(device=device, bucket_mb=args.bucket_mb, planner=args.planner, steps=args.steps,
                   warmup=args.warmup)
    results = launch(_worker, args.world, shapes, modes, options, backend="nccl" if device == "cuda" else "gloo",
                     timeout_s=3600)

    # The slowest rank sets each figure.
    def worst(mode, key):
        return max(r[mode][key] for r in results.values())

    num_params = sum(m.rows * m.cols * m.batch for m in matrices)
    print(f"dmuon bench step | {environment_line(device)}")
    print(f"model {name}: {len(matrices)} Muon matrices, {num_params / 1e6:.1f} M parameters | world {args.world} "
          f"({'NCCL' if device == 'cuda' else 'Gloo'}) | buckets of {args.bucket_mb:g} MiB | planner {args.planner} "
          f"| median of {args.steps} steps after {args.warmup} warm-up")
    header = (f"{'method':<8} {'step ms':>9} {'momentum':>9} {'pack':>8} {'comm wait':>10} {'NS':>9} "
              f"{'apply':>8} {'MB sent/rank':>13} {'buckets':>8} {'peak+ MB':>9} {'vs gather':>10} {'vs AdamW':>9}")
    print(header)
    print("-" * len(header))
    adamw = worst("adamw", "median_s")
    gather = worst("gather", "median_s") if "gather" in modes else None
    for mode in modes:
        split = [max(r[mode]["split"][k] for r in results.values()) for k in range(6)]
        step_s = worst(mode, "median_s")
        vs_gather = f"{gather / step_s:9.2f}x" if gather else f"{'-':>10}"
        print(f"{mode:<8} {step_s * 1e3:9.1f} {split[0] * 1e3:9.1f} {split[1] * 1e3:8.1f} {split[2] * 1e3:10.1f} "
              f"{split[3] * 1e3:9.1f} {split[4] * 1e3:8.1f} {split[5] / 2**20:13.2f} "
              f"{results[0][mode]['num_buckets']:8d} {worst(mode, 'peak_extra_bytes') / 2**20:9.1f} "
              f"{vs_gather} {adamw / step_s:8.3f}x")
    print(f"{'adamw':<8} {adamw * 1e3:9.1f} {'':>9} {'':>8} {'':>10} {'':>9} {'':>8} {'':>13} {'':>8} "
          f"{worst('adamw', 'peak_extra_bytes') / 2**20:9.1f}")
    print("peak+ MB: the slowest rank's peak memory during the timed steps above what it held before "
          f"({'CUDA allocator' if device == 'cuda' else 'resident set, VmHWM'})")
    if "owner" in modes:
        print(f"planner's predicted NS makespan (analytic {device} model): "
              f"{results[0]['owner']['predicted_s'] * 1e3:.1f} ms; measured NS on the slowest rank: "
              f"{max(r['owner']['split'][3] for r in results.values()) * 1e3:.1f} ms")
    return 0
