"""The owner planner: which rank orthogonalizes which Muon matrix.

All solving, costing and hashing is C++ (``dmuon._C.plan``); this package reads
manifests and config.json files and drives the CLI (``python -m dmuon plan``).

Runtime use::

    from dmuon.plan import make_problem, solve
    problem = make_problem([(name, rows, cols, batch), ...], world_size=D)
    plan = solve(problem, "milp")          # plan.owner[i], plan.ranks[r].batches
    text = plan.serialize()                 # broadcast from rank 0; others call
    plan = deserialize(problem, text)       # (checks the inputs' hash)

Weight-ownership mode: ``spread_layers(problem, plan)`` moves same-shape matrices between
owners so one layer's matrices are published by different ranks (loads unchanged).
"""

from __future__ import annotations

from collections.abc import Iterable

from dmuon.plan.manifest import (
    Manifest,
    Matrix,
    layer_ids,
    layer_index,
    load_manifest,
    load_model,
    manifest_from_config,
    shipped_models,
    split_experts,
)

__all__ = [
    "Manifest",
    "Matrix",
    "deserialize",
    "layer_ids",
    "layer_index",
    "layer_spread_stats",
    "load_manifest",
    "load_model",
    "make_problem",
    "manifest_from_config",
    "native",
    "shipped_models",
    "solve",
    "split_experts",
    "spread_layers",
]


def native():
    """``dmuon._C.plan`` (imports torch first, as dmuon._C needs)."""
    import torch  # noqa: F401  (torch's libraries must be loaded before dmuon._C)

    from dmuon import _C

    return _C.plan


def make_problem(
    matrices: Iterable[tuple[str, int, int, int] | Matrix],
    *,
    world_size: int,
    bandwidth_bytes_per_s: float = 50e9,
    memory_cap_bytes: int = 0,
    max_batch: int = 0,
    cost=None,
):
    """A planning problem. ``cost``: an ``AnalyticCostModel``, a ``CostTable`` or a callable
    ``(rows, cols, num_matrices) -> seconds``; default the analytic GPU model."""
    plan = native()
    specs = []
    for m in matrices:
        if isinstance(m, Matrix):
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
