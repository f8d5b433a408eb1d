"""`python -m dmuon plan`: compare the round-robin, LPT and MILP owner plans of a model, and how
well each spreads a layer's matrices over owners before and after layer spreading."""

from __future__ import annotations

import argparse
import json
import sys

from dmuon.cli.plan import manifest as manifests

_SOLVERS = ("round_robin", "lpt", "milp")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan Muon matrix owners across ranks",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help=f"shipped manifest: {', '.join(manifests.shipped_models())}")
    source.add_argument("--manifest", help="JSON manifest or Hugging Face config.json")
    parser.add_argument("--world", type=int, required=True, help="number of ranks D")
    parser.add_argument("--experts", choices=("split", "stack"), default="split",
                        help="plan MoE expert stacks one matrix per expert (as the step engine does) or "
                             "each stack as one unit")
    parser.add_argument("--locality", action="store_true",
                        help="with --experts split: model FSDP2 Shard(0) over the expert dim at world D "
                             "(torch.chunk): an expert owned on the rank holding it receives nothing")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--per-rank", action="store_true", help="show each rank's matrices")
    parser.add_argument("--spread", action="store_true",
                        help="with --per-rank: show the plans after layer spreading (weight-ownership mode)")
    parser.add_argument("--stage-mb", type=float, default=64.0,
                        help="wire MiB per pipeline stage (Execution.bucket_size_mb) of the backward-stage report's "
                             "stages before spreading (after: windows of whole layers)")
    parser.add_argument("--stages", action="store_true",
                        help="show every backward stage's NS seconds per rank (max and mean), before and after")
    parser.add_argument("--plot", metavar="FILE", help="draw every rank's load per solver (PNG)")
    parser.add_argument("--solvers", default=",".join(_SOLVERS), help="comma-separated subset of the solvers")
    parser.add_argument("--bandwidth-gbps", type=float, default=50.0, help="GB/s an owner receives at")
    parser.add_argument("--tflops", type=float, default=None,
                        help="analytic NS throughput in TFLOP/s (default: 400 GPU, 0.05 with --cpu)")
    parser.add_argument("--launch-overhead-us", type=float, default=None,
                        help="analytic per-launch overhead (default: 20 GPU, 50 with --cpu)")
    parser.add_argument("--cpu", action="store_true", help="analytic CPU cost model")
    parser.add_argument("--profile", action="store_true",
                        help="time the real NS op per shape and batch size (GPU when present) instead "
                             "of the analytic model")
    parser.add_argument("--cost-cache", metavar="FILE", help="with --profile: reuse/save the timings here")
    parser.add_argument("--profile-runs", type=int, default=5, help="with --profile: timed runs per point")
    parser.add_argument("--memory-cap-gib", type=float, default=0.0, help="per-rank memory cap (0: none)")
    parser.add_argument("--max-batch", type=int, default=0, help="most matrices per launch (0: unlimited)")
    parser.add_argument("--time-limit", type=float, default=None, help="MILP wall-clock limit, s (default 2)")
    parser.add_argument("--max-nodes", type=int, default=None, help="MILP node cap per stage")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dmuon.cli.plan.planner import layer_ids, make_problem, native

    try:
        solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
        unknown = [s for s in solvers if s not in _SOLVERS]
        if unknown or not solvers:
            raise ValueError(f"--solvers must list some of {', '.join(_SOLVERS)}, got {args.solvers!r}")
        manifest = manifests.load_model(args.model) if args.model else manifests.load_manifest(args.manifest)
        if args.world < 1:
            raise ValueError(f"--world must be at least 1, got {args.world}")
        if args.locality and args.experts != "split":
            raise ValueError("--locality needs --experts split (a whole stack is on no single rank)")
        if args.experts == "split":
            manifest = manifests.split_experts(manifest, world=args.world if args.locality else None)
        plan = native()
        base = plan.AnalyticCostModel.cpu_default() if args.cpu else plan.AnalyticCostModel.gpu_default()
        cost = plan.AnalyticCostModel(
            flops_per_second=base.flops_per_second if args.tflops is None else args.tflops * 1e12,
            launch_overhead_s=base.launch_overhead_s if args.launch_overhead_us is None else args.launch_overhead_us * 1e-6,
            symmetric=base.symmetric,
        )
        if args.profile:
            cost, cost_info = _measured_cost(manifest, args)
        else:
            cost_info = {
                "kind": "analytic",
                "flops_per_second": cost.flops_per_second,
                "launch_overhead_s": cost.launch_overhead_s,
            }
        problem = make_problem(
            manifest.matrices,
            world_size=args.world,
            bandwidth_bytes_per_s=args.bandwidth_gbps * 1e9,
            memory_cap_bytes=int(args.memory_cap_gib * 2**30),
            max_batch=args.max_batch,
            cost=cost,
        )
        env = plan.MilpOptions.from_env()
        milp_options = plan.MilpOptions(
            time_limit_s=env.time_limit_s if args.time_limit is None else args.time_limit,
            max_nodes=env.max_nodes if args.max_nodes is None else args.max_nodes,
        )
        plans = {name: plan.solve(problem, name, milp_options) for name in solvers}
        layer_of = layer_ids(m.name for m in manifest.matrices)
        spread = {name: plan.spread_layers(problem, layer_of, p) for name, p in plans.items()}
        if args.stage_mb < 0:
            raise ValueError(f"--stage-mb must be >= 0, got {args.stage_mb}")
        stages = _backward_stages(manifest, args, cost, milp_options, solvers)
    except (ValueError, OSError, RuntimeError) as error:
        print(f"python -m dmuon plan: error: {error}", file=sys.stderr)
        return 2

    report = _report(manifest, problem, cost_info, args, plans, spread, layer_of)
    report["backward_stages"] = stages
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_table(report, args.per_rank)
    if args.plot:
        _plot(report, args.plot)
    return 0


def _measured_cost(manifest, args):
    """A measured CostTable for every (shape, batch size) the manifest can need."""
    import torch

    from dmuon.cli.plan.profile import batch_sizes, profile_cost_table

    if args.profile_runs < 1:
        raise ValueError(f"--profile-runs must be at least 1, got {args.profile_runs}")
    counts: dict[tuple[int, int, int], int] = {}
    for m in manifest.matrices:
        counts[(m.rows, m.cols, m.batch)] = counts.get((m.rows, m.cols, m.batch), 0) + 1
    points = [(rows, cols, b * stack) for (rows, cols, stack), count in counts.items() for b in batch_sizes(count)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    table = profile_cost_table(points, device=device, num_runs=args.profile_runs, cache_path=args.cost_cache)
    return table, {"kind": "measured", "device": device, "num_points": len(table)}


def _backward_stages(manifest, args, cost, milp_options, solvers) -> dict | None:
    """The engine's stages of a step begun from backward, per solver: before (the plan as
    solved, stage s = every owner's s-th NS batch) and after (backward windows spread, stage
    w = window w: plan/stage_windows.h, each decoder layer a group of backward's hand-over,
    the last layer first, as fully_shard per layer gives). Matrices in parameter order (the
    engine's items), i.e. the manifest's stably sorted by layer; None at world 1 or with
    --experts stack."""
    from dmuon.cli.plan.planner import layer_index, make_problem, native

    if args.world < 2 or any(m.batch > 1 for m in manifest.matrices):
        return None
    plan = native()
    ordered = sorted(manifest.matrices, key=lambda m: layer_index(m.name))
    problem = make_problem(ordered, world_size=args.world, bandwidth_bytes_per_s=args.bandwidth_gbps * 1e9,
                           memory_cap_bytes=int(args.memory_cap_gib * 2**30), max_batch=args.max_batch, cost=cost)
    stage_bytes = int(args.stage_mb * 2**20)
    n = len(ordered)
    layers = [layer_index(m.name) for m in ordered]
    # NOTE: matrices outside the layers (-1) are handed over by no layer's hook.
    group_of = [max(layers) - layer if layer >= 0 else -1 for layer in layers]
    out = {"stage_bytes": stage_bytes, "num_matrices": n, "plans": {}}
    for name in solvers:
        solved = plan.solve(problem, name, milp_options)
        spread = plan.spread_backward_stages(problem, group_of, solved)
        out["plans"][name] = {
            "before": _stage_summary(plan.plan_stage_loads(problem, solved, stage_bytes, windowed=False), n),
            "after": _stage_summary(plan.plan_stage_loads(problem, spread, stage_bytes, windowed=True,
                                                          group_of=group_of), n),
        }
    return out


def _stage_summary(stages, num_matrices: int) -> dict:
    """Per stage max/mean NS seconds over ranks and where it leaves; and their totals.
    ``leaves_at``: the share of backward done when the stage can leave (its lowest matrix);
    ``early_ns_share``: the share of NS seconds in stages that leave before 90% of backward."""
    rows = [{
        "first_matrix": s.first_matrix,
        "last_matrix": s.last_matrix,
        "num_matrices": s.num_matrices,
        "max_s": s.max_seconds,
        "mean_s": s.mean_seconds,
        "leaves_at": (num_matrices - s.first_matrix) / num_matrices,
    } for s in stages]
    ratios = sorted(r["max_s"] / r["mean_s"] for r in rows if r["mean_s"] > 0)
    total = sum(r["mean_s"] for r in rows)
    return {
        "num_stages": len(rows),
        "sum_max_over_sum_mean": sum(r["max_s"] for r in rows) / total if total > 0 else 0.0,
        "worst_max_over_mean": ratios[-1] if ratios else 0.0,
        "median_max_over_mean": ratios[len(ratios) // 2] if ratios else 0.0,
        "first_leaves_at": rows[0]["leaves_at"] if rows else 0.0,
        "early_ns_share": sum(r["mean_s"] for r in rows if r["leaves_at"] < 0.9) / total if total > 0 else 0.0,
        "stages": rows,
    }


def _print_stages(stages: dict | None, per_stage: bool) -> None:
    """Backward stages before -> after stage spreading, per solver."""
    if stages is None:
        return
    print(f"\nbackward stages (step begun from backward, matrices in parameter order; before: "
          f"{stages['stage_bytes'] / 2**20:g} MiB stages of the plan as solved -> after: windows of whole layers, "
          f"spread, same loads)")
    print(f"{'solver':<12} {'stages':>8} {'sum max/sum mean':>17} {'worst max/mean':>15} {'median':>12} "
          f"{'1st leaves at':>14} {'NS in stages leaving <90%':>26}")
    for name, p in stages["plans"].items():
        b, a = p["before"], p["after"]
        print(f"{name:<12} {b['num_stages']:>3}->{a['num_stages']:<4} "
              f"{b['sum_max_over_sum_mean']:>8.2f}->{a['sum_max_over_sum_mean']:<6.2f} "
              f"{b['worst_max_over_mean']:>7.2f}->{a['worst_max_over_mean']:<6.2f} "
              f"{b['median_max_over_mean']:>5.2f}->{a['median_max_over_mean']:<5.2f} "
              f"{b['first_leaves_at']:>6.0%}->{a['first_leaves_at']:<6.0%} "
              f"{b['early_ns_share']:>12.0%}->{a['early_ns_share']:<6.0%}")
        if not per_stage:
            continue
        for tag, summary in (("before", b), ("after", a)):
            print(f"  {name} {tag}: stage  matrices  leaves_at  max_ms  mean_ms  max/mean")
            for k, row in enumerate(summary["stages"]):
                ratio = row["max_s"] / row["mean_s"] if row["mean_s"] > 0 else 0.0
                print(f"    {k:>5} {row['first_matrix']:>5}-{row['last_matrix']:<5} {row['leaves_at']:>7.0%} "
                      f"{row['max_s'] * 1e3:>8.3f} {row['mean_s'] * 1e3:>8.3f} {ratio:>8.2f}")


def _spread_stats(problem, layer_of, plan) -> dict:
    """Layer spreading figures of one plan (see LayerSpreadStats)."""
    from dmuon.cli.plan.planner import native

    stats = native().layer_spread_stats(problem, layer_of, plan)
    return {
        key: getattr(stats, key)
        for key in (
            "num_layers",
            "worst_layer",
            "max_matrices_per_owner",
            "max_collisions",
            "total_collisions",
            "max_bytes_per_owner",
            "matrices_bound",
            "collisions_bound",
            "bytes_bound",
            "matrices_bound_for_counts",
            "bytes_bound_for_counts",
        )
    }


def _report(manifest, problem, cost_info, args, plans, spread, layer_of) -> dict:
    """Everything the table, the JSON and the plot show."""
    shapes = problem.shapes
    out = {
        "model": manifest.name,
        "world_size": problem.world_size,
        "num_matrices": len(problem.matrices),
        "num_shapes": len(shapes),
        "problem_hash": f"{problem.hash:016x}",
        "cost_model": cost_info,
        "bandwidth_bytes_per_s": problem.options.bandwidth_bytes_per_s,
        "memory_cap_bytes": problem.options.memory_cap_bytes,
        "spread": args.spread,
        "show_stages": args.stages,
        "experts": args.experts,
        "locality": args.locality,
        "num_homed": sum(1 for m in problem.matrices if m.home >= 0),
        "plans": {},
    }
    for name, p in plans.items():
        entry = {
            "makespan_s": p.makespan,
            "lower_bound_s": p.lower_bound,
            "gap": p.gap,
            "imbalance": p.imbalance,
            "at_home": sum(1 for i, m in enumerate(problem.matrices) if m.home >= 0 and p.owner[i] == m.home),
            "solve_s": p.solve_seconds,
            "status": p.status,
            "solver_bound_s": p.solver_bound,
            "deterministic": p.deterministic,
            "load_s": [r.load_seconds for r in p.ranks],
            "compute_s": [r.compute_seconds for r in p.ranks],
            "recv_bytes": [r.recv_bytes for r in p.ranks],
            "layer_spread": {
                "before": _spread_stats(problem, layer_of, p),
                "after": _spread_stats(problem, layer_of, spread[name]),
            },
        }
        if args.spread:
            p = spread[name]
        if args.per_rank:
            entry["ranks"] = [
                {
                    "rank": idx,
                    "load_s": r.load_seconds,
                    "recv_bytes": r.recv_bytes,
                    "memory_bytes": r.memory_bytes,
                    "batches": [
                        {
                            "shape": f"{shapes[b.shape_idx].rows}x{shapes[b.shape_idx].cols}",
                            "num_matrices": b.num_matrices,
                            "compute_s": b.compute_seconds,
                            "matrices": [problem.matrices[i].name for i in b.matrix_idx],
                        }
                        for b in r.batches
                    ],
                }
                for idx, r in enumerate(p.ranks)
            ]
        out["plans"][name] = entry
    return out


def _print_table(report: dict, per_rank: bool) -> None:
    cost = report["cost_model"]
    if cost["kind"] == "analytic":
        cost_text = (f"analytic cost {cost['flops_per_second'] / 1e12:g} TFLOP/s "
                     f"+ {cost['launch_overhead_s'] * 1e6:g} us/launch")
    else:
        cost_text = f"measured cost on {cost['device']} ({cost['num_points']} points)"
    print(
        f"{report['model']}: {report['num_matrices']} Muon matrices in {report['num_shapes']} shapes, "
        f"world {report['world_size']}, {cost_text}, {report['bandwidth_bytes_per_s'] / 1e9:g} GB/s"
    )
    header = f"{'solver':<12} {'makespan_ms':>11} {'bound_ms':>9} {'gap%':>7} {'imbalance':>9} " \
             f"{'recv_MB min/max':>17} {'solve_ms':>9} {'cbc_bound_ms':>12}  status"
    print(header)
    for name, p in report["plans"].items():
        recv = p["recv_bytes"]
        print(
            f"{name:<12} {p['makespan_s'] * 1e3:>11.4f} {p['lower_bound_s'] * 1e3:>9.4f} {p['gap'] * 100:>7.2f} "
            f"{p['imbalance']:>9.3f} {min(recv) / 1e6:>8.1f}/{max(recv) / 1e6:<8.1f} "
            f"{p['solve_s'] * 1e3:>9.1f} {_bound(p):>12}  {p['status']}"
        )
    _print_balance(report)
    _print_spread(report)
    _print_stages(report["backward_stages"], per_stage=report["show_stages"])
    if not per_rank:
        return
    for name, p in report["plans"].items():
        print(f"\n{name}: per rank{' (after layer spreading)' if report['spread'] else ''}")
        for rank in p["ranks"]:
            parts = [f"{b['shape']}x{b['num_matrices']}[{', '.join(b['matrices'])}]" for b in rank["batches"]]
            print(f"  rank {rank['rank']:>3} {rank['load_s'] * 1e3:9.4f} ms {rank['recv_bytes'] / 1e6:9.1f} MB  "
                  f"{'; '.join(parts) or '(nothing)'}")


def _print_balance(report: dict) -> None:
    """Slowest rank / mean load per solver, and how many homed matrices stayed home."""
    homes = f", {report['num_homed']} matrices with a home (Shard(0) on the expert dim)" if report["locality"] else ""
    print(f"\nexperts: {report['experts']}{homes}")
    for name, p in report["plans"].items():
        kept = f", at home {p['at_home']}/{report['num_homed']}" if report["locality"] else ""
        print(f"  {name:<12} slowest rank / mean load = {p['imbalance']:.3f}{kept}")


def _print_spread(report: dict) -> None:
    """The worst layer's owners before → after layer spreading, per solver, with bounds."""
    plans = report["plans"]
    num_layers = next(iter(plans.values()))["layer_spread"]["before"]["num_layers"]
    if num_layers == 0:
        print("\nlayer spreading: no layer ids in the matrix names (e.g. 'model.layers.12.…')")
        return
    print(f"\nlayer spreading ({num_layers} layers; worst layer, before -> after, [bound / bound with "
          f"the plan's counts]; same loads)")
    print(f"{'solver':<12} {'matrices/owner':>18} {'collisions':>12} {'all_collisions':>15} {'publish_MB/owner':>26}")
    for name, p in plans.items():
        b, a = p["layer_spread"]["before"], p["layer_spread"]["after"]
        matrices = f"{b['max_matrices_per_owner']}->{a['max_matrices_per_owner']} " \
                   f"[{a['matrices_bound']}/{a['matrices_bound_for_counts']}]"
        collisions = f"{b['max_collisions']}->{a['max_collisions']} [{a['collisions_bound']}]"
        total = f"{b['total_collisions']}->{a['total_collisions']}"
        publish = f"{b['max_bytes_per_owner'] / 1e6:.1f}->{a['max_bytes_per_owner'] / 1e6:.1f} " \
                  f"[{a['bytes_bound'] / 1e6:.1f}/{a['bytes_bound_for_counts'] / 1e6:.1f}]"
        print(f"{name:<12} {matrices:>18} {collisions:>12} {total:>15} {publish:>26}")


def _bound(plan: dict) -> str:
    """CBC's proven bound on the makespan, where the MILP had one."""
    return f"{plan['solver_bound_s'] * 1e3:.4f}" if plan["solver_bound_s"] > 0 else "-"


def _plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plans = report["plans"]
    fig, axes = plt.subplots(len(plans), 1, figsize=(10, 2.6 * len(plans)), sharex=True, sharey=True, squeeze=False)
    for ax, (name, p) in zip(axes[:, 0], plans.items()):
        ranks = range(len(p["load_s"]))
        compute = [c * 1e3 for c in p["compute_s"]]
        recv = [(l - c) * 1e3 for l, c in zip(p["load_s"], p["compute_s"])]
        ax.bar(ranks, compute, width=0.9, label="compute")
        ax.bar(ranks, recv, width=0.9, bottom=compute, label="receive")
        ax.axhline(p["lower_bound_s"] * 1e3, color="k", linestyle="--", linewidth=1, label="lower bound")
        ax.set_title(f"{name}: makespan {p['makespan_s'] * 1e3:.3f} ms, gap {p['gap'] * 100:.2f}%", fontsize=9)
        ax.set_ylabel("load (ms)")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("rank")
    fig.suptitle(f"{report['model']}, world {report['world_size']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
