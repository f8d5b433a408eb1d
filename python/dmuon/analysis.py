"""The C++ core's planner and cost models, public for tools (`python -m dmuon plan | bench`, lab/).

- ``plan``: the owner planner (csrc/plan): ``MatrixSpec``, ``ProblemOptions``,
  ``AnalyticCostModel``, ``CostTable``, ``MilpOptions``, ``build_problem``, ``solve``,
  ``spread_layers``, ``measure_ns_costs`` (the engine's own NS timing), … The step engine
  plans with it by itself; tools use it to plan offline.
- ``ns_schedule(algorithm, num_steps, coefficients=None, restart_after=None, eps=1e-7)``:
  a Newton–Schulz schedule as the engine runs it; ``default_schedule(algorithm,
  num_steps)``: ``([(a, b, c) per step], [restart iterations])`` of an algorithm's default
  (what ``MuonMath`` uses when its coefficients and restarts are None).
- ``step_products(batches, algorithm, num_steps)``, ``fused_step_bound(shapes, …)``,
  ``measured_step_bound(batches, …)``: the distinct products of a step over (count, rows,
  cols) batches and its floors (csrc/ns/ns_bound.h).
- ``sim``: one rank's measured step projected onto a cluster (csrc/sim): ``Topology``,
  ``project_step``, ``rank_traffic``, ``exchange_seconds``, ``ring_seconds``; it reads the
  runtime's ``stage_layout`` (``DMuon.runtime``).

Each name is the extension's own function or module; their docstrings give the arguments.
"""

from __future__ import annotations

from dmuon._ops import _C

plan = _C.plan
ns_schedule = _C.ns_schedule
default_schedule = _C.default_schedule
step_products = _C.step_products
fused_step_bound = _C.fused_step_bound
measured_step_bound = _C.measured_step_bound
sim = _C.sim

__all__ = ["default_schedule", "fused_step_bound", "measured_step_bound", "ns_schedule", "plan", "sim",
           "step_products"]
