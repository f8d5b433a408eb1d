"""`python -m dmuon bench e2e --fake-world D`: one rank's training step at world D on this
one device, for each optimizer, projected onto a cluster.

This process becomes rank R of a fake world of D ranks; the model is sharded by FSDP2 over
the fake mesh (HSDP with --hsdp) and trained on the rank's micro-batch: forward, backward
and the optimizer step run for real, FSDP2's and DMuon's collectives move nothing.

NOTE: values in a fake run are garbage: the fake all-gather copies this rank's shard into
every rank's slot, and the fake reduce-scatter leaves the gradient shards uninitialized.
The benchmark (not the library) therefore overwrites every gradient with small random
values after backward, outside the timed parts, so that the optimizers' NaN/Inf checks
pass and their step runs as on real gradients; the loss is not checked.

FSDP2's own collectives (the same for every optimizer) are counted in one extra untimed
step by a dispatch mode that sees every c10d collective with its buffers and group, and
projected with the same model as the optimizer's exchange (fake_world.PROJECTION_MODEL):
FSDP2 prefetches the next unit's all-gather and reduces the previous unit's gradients
while a unit computes, so every collective but the first all-gather and the last one of
backward can hide behind compute:
    fwd+bwd projected = max(compute, Σ collectives − first − last) + first + last.
The optimizer step is projected as in `bench step --fake-world` (DMuon's bucket pipeline
over every rank, the other ranks predicted from this one); AdamW's step has no collectives.

With --backward-step on (or auto at world > 1), the step begun inside backward
(dmuon.backward_step) is modelled, not run: the fake rank's gradients are garbage until
overwritten after backward, so its step runs after backward and the overlap is projected:
    opt left after backward = opt projected − wait · (S − 1) / S
with `wait` the simulated step's exchange waits on this rank and S its stages: every stage
but the last leaves inside backward (its NS runs one stage later), so its exchange hides
behind backward's compute. NOTE: the step's own compute is not hidden: on one device per
rank the owners' NS inside backward delays backward as much as it shortens the step (the
projection moves it, it does not remove it); the engine's exchanges also share the links
with FSDP2's reduce-scatters, which this model does not charge.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dmuon.bench.environment import environment_line
from dmuon.bench.fake_world import (PROJECTION_MODEL, ClusterTopology, check_rank, check_world, fake_rank,
                                    require_no_process_group, topology_from_args)

# c10d ops by collective kind (the ring formula they are projected with).
_KINDS = {
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
}
# NOTE: gradients are replaced by N(0, σ²) with σ of the order of a real gradient's entries.
_SANITIZED_GRAD_STD = 1e-3


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class CollectiveCounter(TorchDispatchMode):
    """Every c10d collective dispatched while active: (kind, bytes of the full buffer, the
    group's global ranks). The full buffer: an all-gather's output, a reduce-scatter's input,
    an all-reduce's tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.collectives: list[tuple[str, int, list[int]]] = []
        self.other: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1]
            groups = [a for a in args if type(a).__name__ == "ScriptObject"]
            kind = _KINDS.get(name)
            if kind is None or not groups:
                self.other[name] = self.other.get(name, 0) + 1
            else:
                import torch.distributed as dist

                ranks = dist.get_process_group_ranks(dist.ProcessGroup.unbox(groups[0]))
                # all_gather: (output, input, ...); reduce_scatter: (output, input, ...); all_reduce: (tensors, ...)
                full = args[0] if kind != "reduce_scatter" else args[1]
                self.collectives.append((kind, _tensor_bytes(full), ranks))
        return func(*args, **kwargs)


def fsdp_projection(collectives: list, compute_s: float, topology: ClusterTopology) -> dict:
    """FSDP2's counted collectives projected onto `topology`, with forward + backward."""
    from dmuon._ops import _C

    seconds = [_C.sim.ring_seconds(kind, nbytes, topology.of_ranks(ranks)) for kind, nbytes, ranks in collectives]
    total = sum(seconds)
    ends = (seconds[0] + seconds[-1]) if len(seconds) > 1 else total
    by_kind: dict[str, dict] = {}
    for (kind, nbytes, ranks), s in zip(collectives, seconds):
        k = by_kind.setdefault(kind, {"count": 0, "bytes": 0, "seconds": 0.0, "group_sizes": set()})
        k["count"] += 1
        k["bytes"] += nbytes
        k["seconds"] += s
        k["group_sizes"].add(len(ranks))
    for k in by_kind.values():
        k["group_sizes"] = sorted(k["group_sizes"])
    return {"collectives_s": total, "exposed_ends_s": ends,
            "projected_s": max(compute_s, total - ends) + ends, "by_kind": by_kind}


def _sanitize_gradients(model: torch.nn.Module, generator: torch.Generator) -> None:
    """The fake reduce-scatter's uninitialized gradient shards replaced by small random values."""
    from dmuon.distributed import local

    for p in model.parameters():
        if p.grad is not None:
            local(p.grad).normal_(0.0, _SANITIZED_GRAD_STD, generator=generator)


def _muon_projection(opt, topology: ClusterTopology, num_params: int) -> dict | None:
    """DMuon's optimizer step projected from this rank's last step (others predicted)."""
    from dmuon._ops import _C

    runtime = getattr(opt, "_runtime", None)
    if runtime is None or runtime.world_size == 1 or not runtime.last_stats.bucket_times:
        return None
    s = runtime.last_stats
    # NOTE: the engine's start-of-step agreement: [has gradient, gradient bad, momentum bad]
    # per Muon parameter, the checked AdamW gradients and one "input invalid", int64 each.
    projection = _C.sim.project_step(runtime.stage_layout, topology.group(runtime.world_size),
                                     {runtime.rank: s.bucket_times}, list(runtime.options.cost_entries),
                                     runtime.options.device_type, s.pipeline_depth, 8 * (3 * num_params + 1))
    compute = sum(sum(b) for b in s.bucket_times)
    return {"simulated_s": projection.step_s, "compute_s": compute, "fill_s": s.model_fill_s,
            "wait_s": projection.ranks[runtime.rank].wait_s, "bytes_sent": s.bytes_sent,
            "bytes_received": s.bytes_received, "ns_s": sum(b[1] for b in s.bucket_times),
            "num_stages": len(s.bucket_times)}


def backward_step_left(opt_projected_s: float, wait_s: float, num_stages: int) -> float:
    """The optimizer time left after backward when the step begins inside it (module
    docstring): the exchange waits of every stage but the last hide behind backward."""
    if num_stages <= 1:
        return opt_projected_s
    return max(0.0, opt_projected_s - wait_s * (num_stages - 1) / num_stages)


def _train(name: str, config: dict, mesh, topology: ClusterTopology) -> dict:
    """Time `name`'s steps on this fake rank; one more, untimed, counts FSDP2's collectives."""
    from dmuon.bench.e2e import build_sharded, mixed_precision
    from dmuon.bench.e2e_models import model_spec
    from dmuon.bench.e2e_optimizers import Settings

    device = config["device"]
    torch_device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    spec = model_spec(config["model"], config["seq"])
    try:
        # NOTE: backward_step off: gradients are garbage until overwritten after backward
        # (the overlap is modelled, see the module docstring).
        model, opt, counts = build_sharded(spec, name, mesh, mixed_precision(device), torch_device,
                                           Settings(device_type=device, backward_step=False), config["seed"])
    except torch.cuda.OutOfMemoryError as error:
        raise RuntimeError(f"--model {config['model']} does not fit the device at --fake-world {config['world']}: "
                           f"building it and its shards ran out of memory ({error})") from None
    if name != "adamw" and isinstance(getattr(opt, "_runtime_options", None), dict):
        opt._runtime_options["record_timeline"] = True  # NOTE: as bench step --fake-world does
    gen = torch.Generator(device=torch_device).manual_seed(config["seed"] * 1000 + config["rank"])
    tokens = torch.randint(0, spec.vocab_size, (config["micro_batch"], config["seq"]), generator=gen,
                           device=torch_device)
    grad_gen = torch.Generator(device=torch_device).manual_seed(config["seed"] + 17)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    times, muon = [], []
    counter = CollectiveCounter()
    for i in range(config["warmup"] + config["steps"] + 1):
        counting = i == config["warmup"] + config["steps"]  # NOTE: the last step, untimed
        sync()
        start = time.perf_counter()
        if counting:
            with counter:
                spec.loss(model, tokens).backward()
        else:
            spec.loss(model, tokens).backward()
        sync()
        mid = time.perf_counter()
        _sanitize_gradients(model, grad_gen)
        sync()
        before_opt = time.perf_counter()
        opt.step()
        sync()
        end = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if i >= config["warmup"] and not counting:
            times.append((mid - start, end - before_opt))
            projected = _muon_projection(opt, topology, counts["muon_matrices"])
            if projected is not None:
                muon.append(projected)
    result = {"fwd_bwd_s": statistics.median(t[0] for t in times), "opt_s": statistics.median(t[1] for t in times),
              "collectives": counter.collectives, "other_c10d_ops": counter.other, "param_counts": counts}
    if muon:
        result["muon"] = {k: statistics.median(m[k] for m in muon) for k in muon[0]}
    del model, opt
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def run_fake(args) -> int:
    """bench e2e --fake-world: validate, train each optimizer on the fake rank, project, print."""
    from dmuon.bench.e2e import _check_args, _micro_batch_arg
    from dmuon.bench.e2e_models import HF_CONFIGS, require_transformers
    from dmuon.bench.e2e_optimizers import parse_optimizers
    from dmuon.cli_usage import input_checks
    from dmuon.launch import resolve_device

    with input_checks():
        if args.world is not None:
            raise ValueError("--fake-world runs one process; it cannot be combined with --world")
        _check_args(args)
        world = args.fake_world
        replicas, shards = check_world(world, args.hsdp)
        rank = 0 if args.rank is None else args.rank
        check_rank(rank, world)
        topology = topology_from_args(args)
        require_no_process_group()
        device = resolve_device(args.device)
        optimizers = parse_optimizers(args.optimizers)
        micro_batch = _micro_batch_arg(args.micro_batch) or 1  # NOTE: no memory search on a fake rank
        if args.model in HF_CONFIGS:
            require_transformers(args.model)
    config = dict(model=args.model, device=device, seq=args.seq, micro_batch=micro_batch, steps=args.steps,
                  warmup=args.warmup, seed=args.seed, world=world, rank=rank,
                  backward_step_on={"on": True, "off": False}.get(getattr(args, "backward_step", "auto"), world > 1))
    env = environment_line(device)
    hsdp = f" (HSDP {replicas} x {shards})" if replicas > 1 else ""
    print(f"dmuon bench e2e --fake-world {world}{hsdp}, rank {rank} | {env}", flush=True)

    results = {}
    with fake_rank(rank, world):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = (init_device_mesh(device, (replicas, shards), mesh_dim_names=("replicate", "shard")) if replicas > 1
                else init_device_mesh(device, (world,)))
        for name in optimizers:
            results[name] = _train(name, config, mesh, topology)

    record = _report(results, config, topology, env, (replicas, shards))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(record, indent=1, default=str))
        tmp.replace(args.json)
    return 0


def _report(results: dict, config: dict, topology: ClusterTopology, env: str, mesh_shape: tuple) -> dict:
    """The table (printed) and the JSON record."""
    first = next(iter(results.values()))
    fsdp = fsdp_projection(first["collectives"], first["fwd_bwd_s"], topology)
    optimizers = {}
    for name, r in results.items():
        f = fsdp_projection(r["collectives"], r["fwd_bwd_s"], topology)
        opt_projected = r["opt_s"]
        if "muon" in r:
            m = r["muon"]
            opt_projected = max(0.0, r["opt_s"] - m["fill_s"] - m["compute_s"]) + m["simulated_s"]
        opt_left = opt_projected
        if "muon" in r and config.get("backward_step_on") and name != "dmuon-ownership":
            opt_left = backward_step_left(opt_projected, r["muon"]["wait_s"], int(r["muon"]["num_stages"]))
        optimizers[name] = {"fwd_bwd_ms": r["fwd_bwd_s"] * 1e3, "fwd_bwd_projected_ms": f["projected_s"] * 1e3,
                            "opt_ms": r["opt_s"] * 1e3, "opt_projected_ms": opt_projected * 1e3,
                            "opt_left_after_backward_ms": opt_left * 1e3,
                            "projected_step_ms": (f["projected_s"] + opt_left) * 1e3,
                            "muon": {k: v for k, v in r.get("muon", {}).items()}}
    counts = first["param_counts"]
    print(f"model {config['model']}: {counts['total'] / 1e9:.3f} B parameters ({counts['muon_matrices']} Muon "
          f"matrices) | FSDP2 per decoder layer + root | micro-batch {config['micro_batch']} x seq {config['seq']} | "
          f"median of {config['steps']} steps after {config['warmup']} warm-up")
    t = topology.describe()
    print(f"FSDP2 collectives per step: " + ", ".join(
        f"{k['count']} {kind} ({k['bytes'] / 1e9:.2f} GB, groups of {'/'.join(map(str, k['group_sizes']))})"
        for kind, k in fsdp["by_kind"].items()) + f" = {fsdp['collectives_s'] * 1e3:.1f} ms on {t['gpus_per_node']}-GPU "
          f"nodes ({t['intra_GBps']:.0f} GB/s inside, {t['inter_GBps']:.1f} GB/s between)")
    header = (f"{'optimizer':<10} {'fwd+bwd ms':>11} {'projected':>10} {'opt ms':>8} {'projected':>10} "
              f"{'step projected':>15} {'vs AdamW':>9}")
    print(header)
    print("-" * len(header))
    adamw = optimizers.get("adamw", {}).get("projected_step_ms")
    for name, o in optimizers.items():
        versus = f"{(o['projected_step_ms'] - adamw) / adamw * 100:+8.2f}%" if adamw else f"{'-':>9}"
        print(f"{name:<10} {o['fwd_bwd_ms']:11.1f} {o['fwd_bwd_projected_ms']:10.1f} {o['opt_ms']:8.1f} "
              f"{o['opt_projected_ms']:10.1f} {o['projected_step_ms']:15.1f} {versus}")
    if config.get("backward_step_on"):
        print("backward step on (modelled): DMuon's opt projected minus the exchange waits of every stage but the "
              "last (they leave inside backward); step projected uses that")
    print("fwd+bwd / opt ms: measured on the fake rank (collectives free); projected: "
          "max(compute, collectives - first - last) + first + last for FSDP2, DMuon's pipeline simulated; "
          "gradients were overwritten with random values after backward (a fake reduce-scatter leaves them undefined)")
    print(flush=True)
    return {"world": config["world"], "rank": config["rank"], "model": config["model"],
            "mesh": {"replicas": mesh_shape[0], "shards": mesh_shape[1]}, "environment": env, "config": config,
            "topology": t, "projection_model": PROJECTION_MODEL,
            "fsdp": {k: v for k, v in fsdp.items() if k != "projected_s"}, "optimizers": optimizers,
            "param_counts": counts}
