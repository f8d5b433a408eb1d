"""The owner planner offline, for ``python -m dmuon plan`` and the tests: which rank
orthogonalizes which Muon matrix. (The step engine plans in C++ by itself.)

All solving, costing and hashing is C++ (``dmuon.analysis.plan``: ``MatrixSpec``,
``ProblemOptions``, ``AnalyticCostModel``, ``CostTable``, ``MilpOptions``, the solvers);
this module builds problems and runs the solvers::

    from dmuon.cli.plan.planner import make_problem, solve
    problem = make_problem([(name, rows, cols, batch), ...], world_size=D)
    plan = solve(problem, "milp")          # plan.owner[i], plan.ranks[r].batches
    text = plan.serialize()                 # broadcast from rank 0; others call
    plan = deserialize(problem, text)       # (checks the inputs' hash)

Weight-ownership mode: ``spread_layers(problem, plan)`` moves same-shape matrices between
owners so one layer's matrices are published by different ranks (loads unchanged).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["deserialize", "layer_ids", "layer_index", "layer_spread_stats", "make_problem", "native", "solve",
           "spread_layers"]

# A decoder block's index in a parameter name: "model.layers.12.self_attn.q_proj.weight",
# "transformer.h.3.attn.c_attn.weight", "blocks.7.mlp.fc1.weight", "encoder.layer.2....".
# NOTE: the first match wins, so "layers.3.mlp.experts.5.up_proj" is layer 3, not 5.
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?:\.|$)")


def layer_index(name: str) -> int:
    """The layer a parameter name belongs to (``model.layers.12.self_attn.q_proj.weight`` → 12),
    or -1 when the name shows none."""
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else -1


def layer_ids(names: Iterable[str]) -> list[int]:
    """``layer_index`` of every name: the ``layer_of`` argument of layer spreading."""
    return [layer_index(name) for name in names]


def native():
    """The C++ planner, ``dmuon.analysis.plan``."""
    from dmuon.analysis import plan

    return plan


def make_problem(
    matrices: Iterable[tuple[str, int, int, int] | Any],
    *,
    world_size: int,
    bandwidth_bytes_per_s: float = 50e9,
    memory_cap_bytes: int = 0,
    max_batch: int = 0,
    cost=None,
):
    """A planning problem. ``matrices``: (name, rows, cols, batch) tuples, or objects with
    those attributes and ``home`` (the rank holding the matrix whole, -1: none), such as a
    manifest's matrices. ``cost``: an ``AnalyticCostModel``, a ``CostTable`` or a callable
    ``(rows, cols, num_matrices) -> seconds``; default the analytic GPU model."""
    plan = native()
    specs = []
    for m in matrices:
        if hasattr(m, "rows"):
            specs.append(plan.MatrixSpec(m.name, m.rows, m.cols, m.batch, home=m.home))
        else:
            specs.append(plan.MatrixSpec(*m))
    options = plan.ProblemOptions(
        world_size=world_size,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        memory_cap_bytes=memory_cap_bytes,
        max_batch=max_batch,
    )
    return plan.build_problem(specs, options, cost if cost is not None else plan.AnalyticCostModel.gpu_default())


def solve(problem, solver: str = "milp", *, time_limit_s: float | None = None, max_nodes: int | None = None):
    """Runs one solver ('round_robin' | 'lpt' | 'milp'); MILP budget from DMUON_PLAN_* knobs
    unless given."""
    plan = native()
    env = plan.MilpOptions.from_env()
    options = plan.MilpOptions(
        time_limit_s=env.time_limit_s if time_limit_s is None else time_limit_s,
        max_nodes=env.max_nodes if max_nodes is None else max_nodes,
    )
    return plan.solve(problem, solver, options)


def deserialize(problem, text: str):
    """Rebuilds a broadcast plan for ``problem``; raises if it was made for other inputs."""
    return native().deserialize_plan(problem, text)


def spread_layers(problem, plan, layer_of: list[int] | None = None):
    """A copy of ``plan`` whose same-shape matrices are reassigned so that one layer's matrices
    land on different owners (per-rank counts, batches, loads and makespan unchanged).
    ``layer_of``: a layer id per matrix (-1: none); default parsed from the matrix names."""
    layers = layer_ids(m.name for m in problem.matrices) if layer_of is None else list(layer_of)
    return native().spread_layers(problem, layers, plan)


def layer_spread_stats(problem, plan, layer_of: list[int] | None = None):
    """How well ``plan`` spreads layers over owners (``LayerSpreadStats``); ``layer_of`` as in
    ``spread_layers``."""
    layers = layer_ids(m.name for m in problem.matrices) if layer_of is None else list(layer_of)
    return native().layer_spread_stats(problem, layers, plan)
