"""At most two host-blocking collectives per step in every mode of DMuon: one agreement at
its start (structure, every rank's checks, which gradients exist, NaN/Inf, a begun step's
gradients unchanged) and one of its results (Gloo processes; collectives counted from the
profiler's gloo events, collective_count_workers.py). The data exchanges (pieces to their
owners and back, the ownership mode's bucket reductions) are counted apart and not bounded."""

import pytest

import collective_count_workers
from dist_harness import run_distributed

MODES = [("local", 1), ("ddp", 2), ("fsdp2", 2), ("hsdp", 4), ("ownership", 2), ("ownership_mesh", 4),
         ("backward_step", 2), ("skip", 2), ("qk_clip", 2)]


@pytest.mark.parametrize("mode,world", MODES, ids=[m for m, _ in MODES])
def test_a_step_waits_for_at_most_two_collectives(mode, world):
    results = run_distributed(collective_count_workers.collectives_per_step, world, mode)
    for rank, out in results.items():
        step = out["step"]
        assert step["blocking"] <= (0 if world == 1 else 2), (mode, rank, step)
        if mode == "skip":
            assert out["skipped"] == 2, (rank, out)
