"""`python -m dmuon bench step --fake-world D`: one rank's real optimizer step at world D on
this one device, and the step projected onto a cluster.

For each chosen rank in turn this process becomes that rank of a fake world of D ranks
(torch's fake process group, re-initialized per rank), builds the rank's shards of the
manifest's Muon matrices exactly as FSDP2 lays them out (DTensor Shard(0), torch.chunk rows,
uneven and empty shards; HSDP: replicated over --hsdp replicas; --fake-mesh DPxTP: FSDP2 x TP
as torchtitan places it, bench/fake_mesh.py) with random gradients, and
runs the real `DMuon.step` on the step engine: the plan (every rank plans locally),
momentum, packing, the owner's Newton–Schulz of exactly the batches the plan gives it, the
return and apply. The engine records each stage's compute phases (synchronized); the
collectives cost nothing here, and the C++ projection (dmuon.analysis.sim) puts them back: every
rank's stage pipeline (the engine's stage layout: bytes per peer of every stage's exchanges)
with each wait replaced by its modelled time (fake_world.PROJECTION_MODEL). The slowest
rank's NS is reported next to the one-GPU NS of the same matrices (bench/local_ns.py). Gather mode (every rank gathers and
orthogonalizes everything) and fused AdamW on the same shard run the same way.
"""

from __future__ import annotations

import math
import statistics

import torch

from dmuon.cli.bench.environment import environment_line, write_json
from dmuon.cli.bench import fake_mesh as fake_mesh_rules
from dmuon.cli.bench.fake_world import (PROJECTION_MODEL, ClusterTopology, check_fake_run, check_fits, fake_rank,
                                        parse_fake_mesh, world_mesh)
from dmuon.cli.bench.memory import memory_in_use, release
from dmuon.cli.bench.step_inputs import (bench_model, check_counts, chunk_length, dmuon_of, parse_methods,
                                         sharded_tensors)
from dmuon.cli.bench.timing import wall_steps

# NOTE: fp32 parameter, gradient and two AdamW moments per element: the largest state of
# the methods run (DMuon keeps one momentum buffer).
_BYTES_PER_ELEMENT = 16


# ---------------------------------------------------------------------------- inputs
def _local_numel(shapes: list, shard: int, shards: int) -> int:
    """Elements of `shard`'s rows of every matrix (torch.chunk of dim 0)."""
    total = 0
    for shape in shapes:
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += chunk_length(shape[0], shard, shards) * rest
    return total


class _Settings:
    """What every rank run of one invocation shares."""

    def __init__(self, args, device: str, world: int, replicas: int, shapes: list, names: list,
                 fake_mesh: tuple[int, int] | None = None) -> None:
        self.device, self.world, self.shapes, self.names = device, world, shapes, names
        self.replicas, self.shards = replicas, world // replicas
        # The fake mesh (DP x TP): every matrix's TP style; DMuon's group is the whole world.
        self.fake_mesh = fake_mesh
        self.styles = [fake_mesh_rules.tp_style(n, s) for n, s in zip(names, shapes)] if fake_mesh else []
        # NOTE: HSDP too: a 2-D (replicate, shard) mesh takes the mesh layout on the whole
        # world, replicas sending once, as a real HSDP job does (dmuon/distributed.py).
        self.group_size = world if (fake_mesh or self.replicas > 1) else self.shards
        self.steps, self.warmup = args.steps, args.warmup
        self.options = dict(bucket_mb=args.bucket_mb, planner=args.planner, wire_dtype=args.wire_dtype)
        self.memory_budget_gb = args.memory_budget_gb
        self.model = args.model or args.manifest

    def mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        if self.fake_mesh:
            return init_device_mesh(self.device, self.fake_mesh, mesh_dim_names=("dp", "tp"))
        return world_mesh(self.device, self.world, self.replicas)

    def placements(self):
        from torch.distributed.tensor import Replicate, Shard

        return [Replicate(), Shard(0)] if self.replicas > 1 else [Shard(0)]

    def local_shapes(self, rank: int) -> list[tuple]:
        """Every matrix's local shape on `rank` of the fake mesh."""
        dp, tp = self.fake_mesh
        return [fake_mesh_rules.local_shape(shape, style, rank // tp, rank % tp, dp, tp)
                for shape, style in zip(self.shapes, self.styles)]

    def tensors(self, mesh, rank: int, seed: int) -> list:
        """The rank's DTensors (random local values, its own generator per rank and seed)."""
        if not self.fake_mesh:
            return sharded_tensors(self.shapes, mesh, rank % self.shards, self.shards, seed, self.device,
                                    self.placements())
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        gen = torch.Generator(device=self.device).manual_seed(seed * 1000 + rank)
        tensors = []
        for name, shape, style, local in zip(self.names, self.shapes, self.styles, self.local_shapes(rank)):
            placements = fake_mesh_rules.placements(style, self.fake_mesh[1])
            # NOTE: torch's own rule for the local shape (private, torch 2.11) checks ours.
            expected, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
            if tuple(expected) != tuple(local):
                raise RuntimeError(f"--fake-mesh: {name} {shape} {fake_mesh_rules.describe(style)} has local shape "
                                   f"{tuple(expected)} on rank {rank} by torch, {tuple(local)} by bench/fake_mesh.py")
            t = torch.randn(local, generator=gen, device=self.device) / shape[-1] ** 0.5
            tensors.append(DTensor.from_local(t, mesh, placements, run_check=False, shape=torch.Size(shape),
                                              stride=torch.empty(shape, device="meta").stride()))
        return tensors

    def what(self) -> str:
        if self.fake_mesh:
            return f"--fake-mesh {self.fake_mesh[0]}x{self.fake_mesh[1]}"
        return f"--fake-world {self.world}" + (f" --hsdp {self.replicas}" if self.replicas > 1 else "")

    def check_memory(self, rank: int) -> None:
        if self.fake_mesh:
            numel = sum(math.prod(s) for s in self.local_shapes(rank))
        else:
            numel = _local_numel(self.shapes, rank % self.shards, self.shards)
        check_fits(f"--model {self.model} at {self.what()}"
                   + f" (rank {rank}: {numel} float32 elements of shards, {_BYTES_PER_ELEMENT} bytes each for the "
                   "parameter, its gradient and AdamW's two moments)", numel * _BYTES_PER_ELEMENT, self.device,
                   self.memory_budget_gb)


# --------------------------------------------------------------------------- one rank
def _median_timeline(timelines: list[list[tuple]]) -> list[tuple]:
    """Per bucket and phase, the median over steps."""
    return [tuple(statistics.median(step[b][p] for step in timelines) for p in range(4))
            for b in range(len(timelines[0]))]


def run_rank(settings: _Settings, method: str, rank: int) -> dict:
    """One rank's `method` ("owner" | "gather" | "adamw") at the fake world size: medians of
    the timed steps, its counted bytes, the orthogonalized parameters, its peak memory."""
    device = settings.device
    with fake_rank(rank, settings.world):
        mesh = settings.mesh()
        params = [torch.nn.Parameter(t) for t in settings.tensors(mesh, rank, 0)]
        for p, g in zip(params, settings.tensors(mesh, rank, 1)):
            p.grad = g
        before = memory_in_use(device)
        if method == "adamw":
            opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
        else:
            # NOTE: record_timeline: the stage timeline the projection reads (Execution.record_timeline).
            opt = dmuon_of(settings.names, params, method, settings.options, record_timeline=True)
        stats = []

        def keep_stats():
            if method != "adamw":
                s = opt.runtime.last_stats
                stats.append(dict(ns_s=s.ns_s, fill_s=s.model_fill_s, bytes_sent=s.bytes_sent,
                                  bytes_received=s.bytes_received, timeline=s.bucket_times,
                                  orthogonalized=list(s.orthogonalized), pipeline_depth=s.pipeline_depth))

        timed = wall_steps(opt.step, settings.steps, settings.warmup, device, before=before, after_timed=keep_stats)
        record = {"rank": rank, "step_s": statistics.median(timed.times), "peak_extra_bytes": timed.peak_extra,
                  "first_step_peak_extra_bytes": timed.first_peak_extra}
        if method != "adamw":
            runtime = opt.runtime
            if runtime.transport != "fake" and runtime.world_size > 1:
                raise RuntimeError(f"bench step --fake-world: the runtime's group is {runtime.transport!r}, not fake")
            if runtime.world_size != settings.group_size:
                raise RuntimeError(f"bench step {settings.what()}: DMuon's group has {runtime.world_size} ranks, "
                                   f"expected {settings.group_size}")
            timeline = _median_timeline([s["timeline"] for s in stats]) if stats[0]["timeline"] else []
            # NOTE: NS from the timeline (device time); the runtime's ns_s is host time on GPUs.
            ns_s = sum(b[1] for b in timeline) if timeline else statistics.median(s["ns_s"] for s in stats)
            record.update(
                ns_s=ns_s, fill_s=statistics.median(s["fill_s"] for s in stats),
                compute_s=sum(sum(b) for b in timeline), bucket_times=timeline,
                bytes_sent=stats[-1]["bytes_sent"], bytes_received=stats[-1]["bytes_received"],
                orthogonalized=stats[-1]["orthogonalized"], pipeline_depth=stats[-1]["pipeline_depth"],
                group_rank=runtime.rank, group_size=runtime.world_size,
                predicted_rank_seconds=list(runtime.predicted_rank_seconds), owners=list(runtime.item_owners),
                item_params=list(runtime.item_params), stages=[list(s) for s in runtime.stage_items],
                cost_entries=list(runtime.cost_entries), device_type=runtime.options.device_type,
                _layout=runtime.stage_layout)
        del opt, params
    release(device)
    return record


# ----------------------------------------------------------------------- projection
def project_method(method: str, records: dict[int, dict], settings: _Settings, topology: ClusterTopology) -> dict:
    """The projected step of `method` from its measured ranks (records by global rank)."""
    from dmuon.analysis import sim

    first = next(iter(records.values()))
    for rank, r in records.items():
        if (r["owners"], r["stages"]) != (first["owners"], first["stages"]):
            raise RuntimeError(f"{method}: rank {rank} planned other owners or stages than rank {first['rank']} "
                               "(every rank must decide the same; were the cost tables different?)")
    group_size = first["group_size"]
    entry: dict = {"group_size": group_size, "num_stages": len(first["stages"]),
                   "pipeline_depth": first["pipeline_depth"], "item_owners": first["owners"],
                   "item_params": first["item_params"]}
    per_rank = {}
    if group_size == 1:
        for rank, r in records.items():
            per_rank[rank] = dict(projected_step_s=r["step_s"], wait_s=0.0)
        projection = None
        traffic = None
    else:
        # NOTE: the group is the whole world under --fake-mesh and --hsdp (the union of the
        # mesh), else the one FSDP2 shard group.
        group_topology = topology.group(group_size, first_global_rank=0, stride=1)
        measured = {}
        for r in records.values():
            measured.setdefault(r["group_rank"], r["bucket_times"])
        projection = sim.project_step(first["_layout"], group_topology, measured, first["cost_entries"],
                                      first["device_type"], first["pipeline_depth"])
        traffic = sim.rank_traffic(first["_layout"], group_topology)
        for rank, r in records.items():
            t = traffic[r["group_rank"]]
            if (t.sent, t.received) != (r["bytes_sent"], r["bytes_received"]):
                raise RuntimeError(f"{method}: rank {rank} counted {r['bytes_sent']} bytes sent and "
                                   f"{r['bytes_received']} received, the traffic model says {t.sent} and {t.received}")
            outside = max(0.0, r["step_s"] - r["fill_s"] - r["compute_s"])
            per_rank[rank] = dict(projected_step_s=projection.step_s + outside,
                                  wait_s=projection.ranks[r["group_rank"]].wait_s,
                                  send_intra=t.send_intra, send_inter=t.send_inter, recv_intra=t.recv_intra,
                                  recv_inter=t.recv_inter)
        entry.update(simulated_step_s=projection.step_s, simulated_slowest_rank=projection.slowest_rank,
                     calibration={k: {"fixed_s": v.fixed_s, "rate": v.rate, "idle_s": v.idle_s}
                                  for k, v in projection.calibration.items()},
                     predicted_ranks=[g for g, m in enumerate(projection.measured) if not m])
    for rank, r in records.items():
        per_rank[rank].update(measured_step_s=r["step_s"], measured_compute_s=r["compute_s"], ns_s=r["ns_s"],
                              fill_s=r["fill_s"], send_bytes=r["bytes_sent"], recv_bytes=r["bytes_received"],
                              peak_extra_bytes=r["peak_extra_bytes"],
                              first_step_peak_extra_bytes=r["first_step_peak_extra_bytes"])
    entry["per_rank"] = per_rank
    return entry


def _reported_rank(entry: dict, preferred: int | None) -> int:
    """The rank a method's headline figures come from: `preferred` when it ran, else the
    measured rank with the longest projected step."""
    per_rank = entry["per_rank"]
    if preferred in per_rank:
        return preferred
    return max(per_rank, key=lambda r: per_rank[r]["projected_step_s"])


def _headline(entry: dict, rank: int) -> dict:
    r = entry["per_rank"][rank]
    ms = lambda s: s * 1e3  # noqa: E731
    return {"rank": rank, "projected_step_ms": ms(r["projected_step_s"]), "measured_step_ms": ms(r["measured_step_s"]),
            "measured_compute_ms": ms(r.get("measured_compute_s", r["measured_step_s"])),
            "ns_ms": ms(r.get("ns_s", 0.0)), "wait_ms": ms(r.get("wait_s", 0.0)),
            "send_bytes": r.get("send_bytes", 0), "recv_bytes": r.get("recv_bytes", 0),
            "peak_extra_bytes": r["peak_extra_bytes"],
            "first_step_peak_extra_bytes": r.get("first_step_peak_extra_bytes", r["peak_extra_bytes"])}


# -------------------------------------------------------------------------- running
def run_fake(args) -> int:
    """bench step --fake-world: validate, run the chosen ranks, project, print, write JSON."""
    from dmuon.cli.usage import input_checks

    with input_checks():
        if args.world is not None or args.worlds is not None:
            raise ValueError("--fake-world runs one process; it cannot be combined with --world or --worlds")
        check_counts(args)
        fake_mesh = None
        if args.fake_mesh is not None:
            if args.hsdp != 1:
                raise ValueError("--fake-mesh places FSDP2 x TP; it cannot be combined with --hsdp")
            fake_mesh = parse_fake_mesh(args.fake_mesh, args.fake_world)
        world = args.fake_world if fake_mesh is None else fake_mesh[0] * fake_mesh[1]
        replicas, _, topology, device = check_fake_run(args, world)
        methods = parse_methods(args.mode)
        model = bench_model(args, device)
    settings = _Settings(args, device, world, replicas, model.shapes, model.names, fake_mesh)
    env = environment_line(device)
    if fake_mesh:
        counts = {s: settings.styles.count(s) for s in fake_mesh_rules.STYLES}
        print(f"dmuon bench step --fake-mesh {fake_mesh[0]}x{fake_mesh[1]} (world {world}: FSDP2 {fake_mesh[0]} x "
              f"TP {fake_mesh[1]}) | {env}")
        layout = "on the (dp, tp) mesh: " + ", ".join(f"{counts[s]} {s} {fake_mesh_rules.describe(s)}"
                                                      for s in fake_mesh_rules.STYLES if counts[s])
    else:
        hsdp = f" (HSDP {settings.replicas} x {settings.shards})" if settings.replicas > 1 else ""
        print(f"dmuon bench step --fake-world {world}{hsdp} | {env}")
        layout = "sharded on dim 0"
    print(f"{model.line(args, layout)}, each rank in turn on one {device} device", flush=True)

    # The ranks to run: given, all (the whole world, HSDP replicas included), or rank 0 and
    # the rank the planner predicts slowest (known once rank 0 has planned).
    records: dict[str, dict[int, dict]] = {m: {} for m in [*methods, "adamw"]}
    plan_method = "owner" if "owner" in methods else methods[0]
    if args.rank is not None:
        ranks = [args.rank]
    elif args.ranks == "all":
        ranks = list(range(settings.group_size))
    else:
        ranks = [0]
    settings.check_memory(ranks[0])
    records[plan_method][ranks[0]] = run_rank(settings, plan_method, ranks[0])
    predicted = records[plan_method][ranks[0]]["predicted_rank_seconds"]
    slowest = max(range(len(predicted)), key=lambda r: (predicted[r], -r)) if predicted else 0
    if args.rank is None and args.ranks != "all" and slowest not in ranks:
        ranks.append(slowest)
    for rank in ranks:
        settings.check_memory(rank)
        for method in [*methods, "adamw"]:
            if rank not in records[method]:
                records[method][rank] = run_rank(settings, method, rank)

    # Orthogonalized exactly once, by the owner (every rank ran: a full check).
    owner_records = records.get("owner", {})
    if len(owner_records) == settings.group_size:
        done = sorted(i for r in owner_records.values() for i in r["orthogonalized"])
        num_items = len(next(iter(owner_records.values()))["item_params"])
        if done != list(range(num_items)):
            raise RuntimeError(f"owner mode: the ranks orthogonalized matrices {done}, expected each of the "
                               f"{num_items} once")

    entries = {m: project_method(m, records[m], settings, topology) for m in methods}
    adamw = {rank: dict(projected_step_s=r["step_s"], measured_step_s=r["step_s"], peak_extra_bytes=r["peak_extra_bytes"],
                        first_step_peak_extra_bytes=r["first_step_peak_extra_bytes"])
             for rank, r in records["adamw"].items()}
    entries["adamw"] = {"per_rank": adamw}
    preferred = slowest if slowest in ranks else None
    methods_json = {m: {**_headline(e, _reported_rank(e, preferred)), **{k: v for k, v in e.items() if k != "per_rank"},
                        "per_rank": {str(r): v for r, v in e["per_rank"].items()}} for m, e in entries.items()}
    planner = None
    if "owner" in methods:
        r = _reported_rank(entries["owner"], preferred)
        group_rank = records["owner"][r]["group_rank"]
        planner = {"slowest_rank": slowest, "predicted_ns_ms": predicted[slowest] * 1e3 if predicted else None,
                   "measured_ns_ms": records["owner"][slowest]["ns_s"] * 1e3 if slowest in records["owner"] else None,
                   "reported_rank": r, "reported_rank_predicted_ns_ms":
                       predicted[group_rank] * 1e3 if predicted else None}
    if "owner" in methods:
        owner = methods_json["owner"]
        mine = records["owner"][owner["rank"]]
        # NOTE: the rank's matrices (items: one per matrix of a stack) as the plan gives them, not
        # the step's list of what it orthogonalized: on an H100 (fake world 8, Qwen2.5-7B) that
        # list came back empty for rank 0 while its NS took 53.7 ms, and local NS read 0.0 ms.
        owner["local_ns_items"] = [i for i, o in enumerate(mine["owners"]) if o == mine["group_rank"]]
        if device == "cuda":
            # The same matrices through the one-GPU path, in the same run.
            from dmuon.cli.bench.local_ns import local_ns_ms

            local = local_ns_ms([tuple(settings.shapes[mine["item_params"][i]][-2:]) for i in owner["local_ns_items"]],
                                device)
            owner.update(local_ns_ms=local, ns_vs_local=owner["ns_ms"] / local if local > 0 else None)
    mesh_record = None
    if fake_mesh:
        mesh_record = {"dp": fake_mesh[0], "tp": fake_mesh[1], "styles": settings.styles,
                       "placements": {s: fake_mesh_rules.describe(s) for s in fake_mesh_rules.STYLES}}
    record = {"world": world, "model": model.name, "hsdp": {"replicas": settings.replicas, "shards": settings.shards},
              "fake_mesh": mesh_record,
              "device": device, "environment": env, "wire_dtype": model.wire, "bucket_mb": args.bucket_mb,
              "planner": args.planner, "steps": args.steps, "warmup": args.warmup, "ranks_run": ranks,
              "topology": topology.describe(), "projection_model": PROJECTION_MODEL, "methods": methods_json,
              "planner_prediction": planner}
    _print_fake(record)
    write_json(args.json, record)
    return 0


def _print_fake(record: dict) -> None:
    t = record["topology"]
    print(f"topology: {t['gpus_per_node']} GPUs per node, intra-node {t['intra_GBps']:.1f} GB/s + "
          f"{t['intra_latency_us']:g} µs, inter-node {t['inter_GBps']:.1f} GB/s + {t['inter_latency_us']:g} µs per GPU "
          f"| ranks run: {record['ranks_run']}")
    header = (f"{'method':<14} {'rank':>5} {'projected ms':>13} {'fake step ms':>13} {'compute ms':>11} {'NS ms':>8} "
              f"{'wait ms':>8} {'MB sent':>9} {'MB recv':>9} {'peak+ MB':>9} {'1st peak+':>10} {'vs gather':>10} "
              f"{'x AdamW':>8}")
    print(header)
    print("-" * len(header))
    methods = record["methods"]
    adamw = methods["adamw"]["projected_step_ms"]
    gather = methods.get("gather", {}).get("projected_step_ms")
    for name, m in methods.items():
        label = "adamw (fused)" if name == "adamw" else name
        versus = f"{gather / m['projected_step_ms']:9.2f}x" if gather else f"{'-':>10}"
        print(f"{label:<14} {m['rank']:>5} {m['projected_step_ms']:13.1f} {m['measured_step_ms']:13.1f} "
              f"{m['measured_compute_ms']:11.1f} {m['ns_ms']:8.1f} {m['wait_ms']:8.1f} {m['send_bytes'] / 2**20:9.1f} "
              f"{m['recv_bytes'] / 2**20:9.1f} {m['peak_extra_bytes'] / 2**20:9.1f} "
              f"{m['first_step_peak_extra_bytes'] / 2**20:10.1f} {versus} "
              f"{m['projected_step_ms'] / adamw:7.2f}x")
    owner = methods.get("owner", {})
    if owner.get("local_ns_ms"):
        print(f"NS of rank {owner['rank']}: {owner['ns_ms']:.1f} ms; the same matrices on one GPU (orthogonalize "
              f"op, same-shape batches): {owner['local_ns_ms']:.1f} ms ({owner['ns_vs_local']:.2f}x)")
    p = record.get("planner_prediction")
    if p and p["predicted_ns_ms"] is not None:
        measured = f"{p['measured_ns_ms']:.1f} ms" if p["measured_ns_ms"] is not None else "not run"
        print(f"planner: predicted NS of the slowest rank ({p['slowest_rank']}) {p['predicted_ns_ms']:.1f} ms, "
              f"measured {measured}")
    per_rank = methods.get("owner", {}).get("per_rank", {})
    if len(per_rank) > 2:
        print("owner per rank: " + ", ".join(f"{r}: NS {v['ns_s'] * 1e3:.1f} / wait {v.get('wait_s', 0) * 1e3:.1f} ms"
                                             for r, v in per_rank.items()))
    print("projected: the step on the topology (fake_world.PROJECTION_MODEL, also in the JSON); fake step: the "
          "measured step with free collectives; compute: the pipeline's measured phases")
    print(flush=True)
