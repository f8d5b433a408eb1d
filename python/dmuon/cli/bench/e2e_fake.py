"""`python -m dmuon bench e2e --fake-world D`: one rank's training step at world D on this
one device, for each optimizer, projected onto a cluster.

This process becomes rank R of a fake world of D ranks; the model is sharded by FSDP2 over
the fake mesh (HSDP with --hsdp) and trained on the rank's micro-batch: forward, backward
and the optimizer step run for real, FSDP2's and DMuon's collectives move nothing.

NOTE: values in a fake run are garbage: the fake all-gather copies this rank's shard into
every rank's slot, and the fake reduce-scatter leaves the gradient shards uninitialized.
The benchmark (not the library) therefore overwrites each FSDP2 group's gradients with
small random values inside its post-backward, right after its reduction and before any
optimizer hook reads them (bench.fake_grads), so that the optimizers' NaN/Inf checks pass
and their step, begun from backward or not, runs as on real gradients; the loss is not
checked. The time of that overwrite is measured apart (one pass over every gradient after
a step) and taken out of forward + backward.

FSDP2's own collectives (the same for every optimizer) are counted in one extra untimed
step by a dispatch mode that sees every c10d collective with its buffers and group, and
projected with the same model as the optimizer's exchange (fake_world.PROJECTION_MODEL):
FSDP2 prefetches the next unit's all-gather and reduces the previous unit's gradients
while a unit computes, so every collective but the first all-gather and the last one of
backward can hide behind compute:
    fwd+bwd projected = max(compute, Σ collectives − first − last + early exchanges) + first + last
with compute the measured forward + backward less the fake world's work in it (the
gradient overwrite, DMuon's model fills), and `early exchanges` DMuon's forward and return
all_to_alls issued inside backward, of every early stage but the last (they share the
links; 0 when the step is not begun there; the last stage's, issued as backward ends and
at step(), are charged to the step).
The optimizer step is projected as in `bench step --fake-world` (DMuon's stage pipeline
over every rank, the other ranks predicted from this one); AdamW's step has no collectives.

With --backward-step on the step really begins from backward
(dmuon.backward_step): each group's gradients reach DMuon's hook sane, the stages whose
gradients are final leave inside backward, and their owners' NS runs there on this device,
competing with backward for it as on a real rank: the measured forward + backward includes
it. `opt left after backward` is what is left at step(), measured, with the waits of the
collectives still ahead projected (fake_step_projection: the last early stage's forward
and return, and the pipeline of the stages that did not leave early, with both
agreements). The table's last
lines give the share of the NS matrices that ran inside backward (the engine's
early_orthogonalized / num_orthogonalized, as `bench e2e` prints it for real worlds).
NOTE: the fake rank records its stage timeline (the projection needs it) as device time
between marks on the engine's stream (step/phase_clock.h), read at step(): nothing waits
for the device inside backward, as on a real rank. It used to synchronize the device at
every phase, which drains the queue backward's kernels were launched into (measured at
fake 64 on 1.5B: within the runs' noise; the hooks' host time was the larger cost,
BENCHMARKS.md "Host time of the step, and the step begun from backward").
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dmuon.cli.bench.e2e_setup import backward_step_on
from dmuon.cli.bench.environment import environment_line, write_json
from dmuon.cli.bench.fake_world import PROJECTION_MODEL, ClusterTopology, check_fake_run, fake_rank, world_mesh
from dmuon.cli.bench.memory import release, sync

# c10d ops by collective kind (the ring formula they are projected with).
_KINDS = {
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
}


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


def fsdp_projection(collectives: list, compute_s: float, topology: ClusterTopology, engine_s: float = 0.0) -> dict:
    """FSDP2's counted collectives projected onto `topology`, with forward + backward;
    `engine_s`: seconds of DMuon's exchanges issued inside backward (the same links)."""
    from dmuon.analysis import sim

    seconds = [sim.ring_seconds(kind, nbytes, topology.of_ranks(ranks)) for kind, nbytes, ranks in collectives]
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
            "projected_s": max(compute_s, total - ends + engine_s) + ends, "by_kind": by_kind}


class _FakeRankTrainer:
    """One optimizer's model on the fake rank: built once, then stepped on demand, so that
    several optimizers can be trained in turns (`--order turns`)."""

    def __init__(self, name: str, config: dict, mesh, topology: ClusterTopology) -> None:
        from dmuon.cli.bench.e2e_setup import build_sharded, mixed_precision, random_tokens, torch_device
        from dmuon.cli.bench.e2e_models import model_spec
        from dmuon.cli.bench.e2e_optimizers import Settings
        from dmuon.cli.bench.fake_grads import PostBackwardSanitizer

        self.name, self.config, self.topology = name, config, topology
        self.device = config["device"]
        device = torch_device(self.device)
        self.spec = model_spec(config["model"], config["seq"])
        # NOTE: installed before the optimizer is built: it runs before DMuon's backward hooks.
        self.sanitizer = PostBackwardSanitizer(torch.Generator(device=device).manual_seed(config["seed"] + 17))
        try:
            # NOTE: record_timeline: the stage timeline the projection reads, as bench step --fake-world.
            self.model, self.opt, self.counts, _ = build_sharded(
                self.spec, name, mesh, mixed_precision(self.device), device,
                Settings(device_type=self.device, backward_step=config["backward_step_on"],
                         bucket_size_mb=config.get("bucket_mb"), record_timeline=True),
                config["seed"], before_optimizer=self.sanitizer.install)
        except torch.cuda.OutOfMemoryError as error:
            together = (" with the other optimizers' models alive (--order turns; --order sequential holds one "
                        "at a time)" if config["order"] == "turns" and len(config["optimizers"]) > 1 else "")
            raise RuntimeError(f"--model {config['model']} does not fit the device at --fake-world "
                               f"{config['world']}{together}: building {name}'s model and its shards ran out of "
                               f"memory ({error})") from None
        self.tokens = random_tokens(self.spec, config["micro_batch"], config["seq"], config["seed"], config["rank"],
                                    device)
        self.times: list[tuple[float, float]] = []
        self.muon: list[dict] = []
        self.sanitize: list[float] = []
        self.counter = CollectiveCounter()

    def step(self, timed: bool, counting: bool = False, phase=lambda name: contextlib.nullcontext()) -> None:
        """One training step: forward + backward, then the optimizer step, each timed;
        `counting`: FSDP2's collectives counted and the gradient overwrite timed alone
        (an untimed step); `phase(name)`: the context each phase runs in (the profiler's
        host ranges, e2e_profile.PHASES)."""
        from dmuon.cli.bench.fake_grads import sanitize_gradients
        from dmuon.cli.bench.fake_step_projection import muon_projection

        self.sanitizer.clear_log()
        sync(self.device)
        start = time.perf_counter()
        with phase("bench.fwd_bwd"):
            if counting:
                with self.counter:
                    self.spec.loss(self.model, self.tokens).backward()
            else:
                self.spec.loss(self.model, self.tokens).backward()
            sync(self.device)
        mid = time.perf_counter()
        with phase("bench.opt_step"):
            self.opt.step()
            sync(self.device)
        end = time.perf_counter()
        if counting:
            # The overwrite's own time: one pass over every gradient (values unused now).
            for _ in range(3):
                sync(self.device)
                t0 = time.perf_counter()
                sanitize_gradients(self.model.parameters(), self.sanitizer.generator)
                sync(self.device)
                self.sanitize.append(time.perf_counter() - t0)
        self.opt.zero_grad(set_to_none=True)
        if timed and not counting:
            self.times.append((mid - start, end - mid))
            projected = muon_projection(self.opt, self.topology)
            if projected is not None:
                self.muon.append(projected)

    def result(self) -> dict:
        """Medians of the timed steps, FSDP2's collectives, the engine's stage figures."""
        result = {"fwd_bwd_s": statistics.median(t[0] for t in self.times),
                  "opt_s": statistics.median(t[1] for t in self.times),
                  "sanitize_s": statistics.median(self.sanitize), "sanitized_groups": self.sanitizer.groups,
                  "collectives": self.counter.collectives, "other_c10d_ops": self.counter.other,
                  "param_counts": self.counts, "backward_step": backward_step_on(self.opt)}
        if self.muon:
            result["muon"] = {k: statistics.median(m[k] for m in self.muon) for k in self.muon[0]}
        return result

    def close(self) -> None:
        del self.model, self.opt, self.tokens
        release(self.device)


def _profile(trainer: _FakeRankTrainer) -> None:
    """One more (untimed) step of `trainer` under torch.profiler; its summary printed."""
    from dmuon.cli.bench.e2e_profile import format_phases, profiled_step, summarize

    on_gpu = trainer.device == "cuda"
    prof = profiled_step(lambda phase: trainer.step(timed=False, phase=phase), on_gpu)
    print(format_phases(trainer.name, summarize(prof, on_gpu), on_gpu), flush=True)


def _train_sequential(config: dict, mesh, topology: ClusterTopology) -> dict:
    """Each optimizer's warm-up, timed and counting steps, one optimizer after the other
    (one model alive at a time)."""
    results = {}
    for name in config["optimizers"]:
        results.update(_train_in_turns(config, mesh, topology, [name]))
    return results


def _train_in_turns(config: dict, mesh, topology: ClusterTopology, names: list[str] | None = None) -> dict:
    """Every optimizer's model (of `names`, default all) alive at once, one step of each in
    turn, the order rotated every step. NOTE: trained one after the other, the same forward + backward moved from
    197 to 272 ms between the optimizers of one run on an H200 (docs/benchmarks/history.md,
    "Sections moved out"): the device's clocks drift over a run
    (power limit), so a comparison within 1% needs both sides in the same stretch of it."""
    trainers = [_FakeRankTrainer(name, config, mesh, topology) for name in names or config["optimizers"]]
    for i in range(config["warmup"] + config["steps"]):
        k = i % len(trainers)
        for trainer in trainers[k:] + trainers[:k]:
            trainer.step(timed=i >= config["warmup"])
    if config.get("profile"):
        for trainer in trainers:
            _profile(trainer)
    results = {}
    for trainer in trainers:
        trainer.step(timed=False, counting=True)
        results[trainer.name] = trainer.result()
    for trainer in trainers:
        trainer.close()
    return results


def run_fake(args) -> int:
    """bench e2e --fake-world: validate, train each optimizer on the fake rank, project, print."""
    from dmuon.cli.bench.e2e_setup import check_args, micro_batch_arg
    from dmuon.cli.bench.e2e_optimizers import parse_optimizers
    from dmuon.cli.usage import input_checks

    with input_checks():
        if args.world is not None:
            raise ValueError("--fake-world runs one process; it cannot be combined with --world")
        check_args(args)
        world = args.fake_world
        replicas, shards, topology, device = check_fake_run(args, world)
        rank = 0 if args.rank is None else args.rank
        optimizers = parse_optimizers(args.optimizers)
        micro_batch = micro_batch_arg(args.micro_batch) or 1  # NOTE: no memory search on a fake rank
    config = dict(model=args.model, device=device, seq=args.seq, micro_batch=micro_batch, steps=args.steps,
                  warmup=args.warmup, seed=args.seed, world=world, rank=rank,
                  bucket_mb=args.bucket_mb, optimizers=optimizers, order=args.order or "turns", profile=args.profile,
                  backward_step_on=args.backward_step == "on")  # NOTE: auto: the library's default (off)
    env = environment_line(device)
    hsdp = f" (HSDP {replicas} x {shards})" if replicas > 1 else ""
    print(f"dmuon bench e2e --fake-world {world}{hsdp}, rank {rank} | {env}", flush=True)

    with fake_rank(rank, world):
        mesh = world_mesh(device, world, replicas)
        train = _train_in_turns if config["order"] == "turns" else _train_sequential
        results = train(config, mesh, topology)

    write_json(args.json, _report(results, config, topology, env, (replicas, shards)))
    return 0


def _report(results: dict, config: dict, topology: ClusterTopology, env: str, mesh_shape: tuple) -> dict:
    """The table (printed) and the JSON record."""
    from dmuon.cli.bench.fake_step_projection import opt_left_after_backward, opt_projected

    first = next(iter(results.values()))
    fsdp = fsdp_projection(first["collectives"], first["fwd_bwd_s"], topology)
    optimizers = {}
    for name, r in results.items():
        m = r.get("muon")
        # NOTE: the fake world's work inside backward is not a real rank's.
        compute = max(0.0, r["fwd_bwd_s"] - r["sanitize_s"] - (m["early_fill_s"] if m else 0.0))
        f = fsdp_projection(r["collectives"], compute, topology, m["early_exchange_s"] if m else 0.0)
        whole = opt_projected(r["opt_s"], m) if m else r["opt_s"]
        left = opt_left_after_backward(r["opt_s"], m) if m else r["opt_s"]
        optimizers[name] = {"fwd_bwd_ms": r["fwd_bwd_s"] * 1e3, "fwd_bwd_compute_ms": compute * 1e3,
                            "fwd_bwd_projected_ms": f["projected_s"] * 1e3, "sanitize_ms": r["sanitize_s"] * 1e3,
                            "opt_ms": r["opt_s"] * 1e3, "opt_projected_ms": whole * 1e3,
                            "opt_left_after_backward_ms": left * 1e3,
                            "projected_step_ms": (f["projected_s"] + left) * 1e3,
                            "backward_step": r["backward_step"], "sanitized_groups": r["sanitized_groups"],
                            "muon": dict(m or {})}
    counts = first["param_counts"]
    print(f"model {config['model']}: {counts['total'] / 1e9:.3f} B parameters ({counts['muon_matrices']} Muon "
          f"matrices) | FSDP2 per decoder layer + root | micro-batch {config['micro_batch']} x seq {config['seq']} | "
          f"median of {config['steps']} steps after {config['warmup']} warm-up, "
          + ("optimizers in turns (one step each, order rotated)" if config["order"] == "turns"
             else "one optimizer after the other"))
    t = topology.describe()
    print(f"FSDP2 collectives per step: " + ", ".join(
        f"{k['count']} {kind} ({k['bytes'] / 1e9:.2f} GB, groups of {'/'.join(map(str, k['group_sizes']))})"
        for kind, k in fsdp["by_kind"].items()) + f" = {fsdp['collectives_s'] * 1e3:.1f} ms on {t['gpus_per_node']}-GPU "
          f"nodes ({t['intra_GBps']:.0f} GB/s inside, {t['inter_GBps']:.1f} GB/s between)")
    width = max(10, *map(len, optimizers))
    header = (f"{'optimizer':<{width}} {'fwd+bwd ms':>11} {'projected':>10} {'opt ms':>8} {'projected':>10} "
              f"{'left after bwd':>15} {'step projected':>15} {'vs AdamW':>9}")
    print(header)
    print("-" * len(header))
    adamw = optimizers.get("adamw", {}).get("projected_step_ms")
    for name, o in optimizers.items():
        versus = f"{(o['projected_step_ms'] - adamw) / adamw * 100:+8.2f}%" if adamw else f"{'-':>9}"
        print(f"{name:<{width}} {o['fwd_bwd_ms']:11.1f} {o['fwd_bwd_projected_ms']:10.1f} {o['opt_ms']:8.1f} "
              f"{o['opt_projected_ms']:10.1f} {o['opt_left_after_backward_ms']:15.1f} {o['projected_step_ms']:15.1f} "
              f"{versus}")
    for name, o in optimizers.items():
        m = o["muon"]
        if o["backward_step"] and m:
            print(f"{name}: {m['early_share'] * 100:.0f}% of the owners' Newton–Schulz matrices ran inside backward "
                  f"({m['early_orthogonalized']:.0f} of {m['num_orthogonalized']:.0f}, {m['early_ns_s'] * 1e3:.1f} ms; "
                  f"{m['early_stages']:.0f} of {m['num_stages']:.0f} stages left early; median step)")
    if any(o["backward_step"] for o in optimizers.values()):
        print("backward step on (run, not modelled): fwd+bwd includes the NS begun inside backward; left after bwd: "
              "measured at step() + the collectives still ahead projected (the last early stage's forward and "
              "return, the stages that did not leave early); the other early forwards and returns share FSDP2's "
              "links in fwd+bwd projected")
    print("fwd+bwd / opt ms: measured on the fake rank (collectives free); projected: "
          "max(compute, collectives - first - last + early exchanges) + first + last for FSDP2 (compute without the "
          "gradient overwrite and model fills), DMuon's pipeline simulated; gradients were overwritten with random "
          "values inside each FSDP2 group's post-backward (a fake reduce-scatter leaves them undefined)")
    print(flush=True)
    return {"world": config["world"], "rank": config["rank"], "model": config["model"],
            "mesh": {"replicas": mesh_shape[0], "shards": mesh_shape[1]}, "environment": env, "config": config,
            "topology": t, "projection_model": PROJECTION_MODEL,
            "fsdp": {k: v for k, v in fsdp.items() if k != "projected_s"}, "optimizers": optimizers,
            "param_counts": counts}
