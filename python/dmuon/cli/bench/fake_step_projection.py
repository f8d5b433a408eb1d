"""DMuon's step on a fake rank (`bench e2e --fake-world`) projected onto a cluster: the
whole step as if it ran after backward, and, when it was begun from backward
(dmuon.backward_step), the part left at step().

The engine's stages (csrc/step/engine_early.cpp): a stage whose parameters' gradients are
all final leaves inside backward — its check, momentum and forward all_to_all at once, its
owners' NS and its return all_to_all when the next stage leaves (the last one's in
finish()). At step() remain: the last early stage's NS and return, the agreement, the
landing of the returns (in commit()), the pipeline of the stages that did not leave early,
and the agreement on the results. The projection of what is left:

    opt left = max(0, opt − fill at step() − late compute) + late simulated
               + last early forward + last early return

with `opt` the fake rank's measured step() (its collectives free), `fill at step()` the
fake world's model fills there (no real work), `late compute` / `late simulated` the
measured compute phases / the simulated pipeline (with both agreements) of the stages
that did not leave early, the forward of the last stage that left early (issued by the
last hook, at the end of backward: its NS waits for it at step()), and that stage's
return. The other early stages' forwards and returns are charged to backward
(`early_exchange_s`, on the links FSDP2's collectives use: bench.e2e_fake).
NOTE: assumed, as in sim/pipeline.h: compute and transfers do not slow each other, and an
early stage's NS inside backward does not wait for its forward (it left one stage before).
Whether a gradient changed since its hand-over rides in the start agreement, as its flags do.
"""

from __future__ import annotations

import dmuon
from dmuon.cli.bench.fake_world import ClusterTopology


def project(runtime, topology: ClusterTopology, rank_times: list, layout) -> tuple[float, float]:
    """(simulated seconds, this rank's waits) of the pipeline of `layout`'s stages with this
    rank's measured `rank_times` (one phase tuple per stage), the other ranks predicted."""
    from dmuon.analysis import sim

    projection = sim.project_step(layout, topology.group(runtime.world_size), {runtime.rank: rank_times},
                                  list(runtime.cost_entries), runtime.options.device_type,
                                  runtime.last_stats.pipeline_depth)
    return projection.step_s, projection.ranks[runtime.rank].wait_s


def muon_projection(opt, topology: ClusterTopology) -> dict | None:
    """This rank's last step: the whole pipeline projected (`simulated_s`), the early work
    (stats of the engine), and what is left at step() (`late_*`, `early_last_*`)."""
    from dmuon.analysis import sim
    from dmuon.cli.bench.e2e_setup import early_ns_share

    if not isinstance(opt, dmuon.DMuon):
        return None
    runtime = opt.runtime
    if runtime.world_size == 1 or not runtime.last_stats.bucket_times:
        return None
    s = runtime.last_stats
    times = [tuple(b) for b in s.bucket_times]
    layout = runtime.stage_layout
    simulated, wait = project(runtime, topology, times, layout)
    out = {"simulated_s": simulated, "compute_s": sum(sum(b) for b in times), "fill_s": s.model_fill_s,
           "wait_s": wait, "bytes_sent": s.bytes_sent, "bytes_received": s.bytes_received,
           "ns_s": sum(b[1] for b in times), "num_stages": len(times),
           "early_stages": s.early_stages, "early_orthogonalized": s.early_orthogonalized,
           "num_orthogonalized": s.num_orthogonalized, "early_ns_s": s.early_ns_s, "early_fill_s": s.early_fill_s,
           "early_share": early_ns_share(s) or 0.0}
    first = int(s.early_stages)
    exchanges = sim.exchange_seconds(layout, topology.group(runtime.world_size))
    # NOTE: the last stage to leave does so in the last hook, at the end of backward: its
    # forward is not hidden behind backward (its NS at step() waits for it), nor is its
    # return (after that NS).
    out["early_exchange_s"] = sum(f + r for f, r in exchanges[:max(0, first - 1)])
    out["early_last_forward_s"] = exchanges[first - 1][0] if first else 0.0
    out["early_last_return_s"] = exchanges[first - 1][1] if first else 0.0
    if first == 0:
        out.update(late_simulated_s=simulated, late_compute_s=out["compute_s"])
    else:
        late_simulated, _ = project(runtime, topology, times[first:], layout.from_stage(first))
        out.update(late_simulated_s=late_simulated, late_compute_s=sum(sum(b) for b in times[first:]))
    return out


def opt_projected(opt_s: float, m: dict) -> float:
    """The whole step as if it ran after backward: measured outside the pipeline, the
    pipeline simulated."""
    return max(0.0, opt_s - m["fill_s"] - m["compute_s"]) + m["simulated_s"]


def opt_left_after_backward(opt_s: float, m: dict) -> float:
    """What is left of the step at step() (module docstring); the whole step when nothing
    left early."""
    if not m["early_stages"]:
        return opt_projected(opt_s, m)
    fill_at_step = m["fill_s"] - m["early_fill_s"]
    return (max(0.0, opt_s - fill_at_step - m["late_compute_s"]) + m["late_simulated_s"] + m["early_last_forward_s"]
            + m["early_last_return_s"])
