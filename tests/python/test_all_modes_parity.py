"""Every mode of DMuon gives the update of the pure-PyTorch float64 reference
(dmuon.reference) on the same inputs: one process, FSDP2 (world 3: uneven and empty shards),
DDP (world 2), HSDP (2×2), gather mode (world 3), the weight-ownership mode (world 2: every
matrix owned, or two owned and two replicas beside them) and FSDP2 of a float64 model with a
row-blocked matrix of unequal blocks (world 3), on Gloo CPU processes
(tests/python/all_modes_workers.py). One step engine steps every Muon matrix, owned or not."""

import pytest

import all_modes_workers
from dist_harness import run_distributed

# NOTE: DMuon's CPU Newton–Schulz iterates in float32 and the reference in float64: the
# updates here differed from the reference's by at most 4.0e-6 of their norm in every mode
# (measured on the 2-core development machine); 2e-5 leaves 5x for the order of sums and the
# gradient average's rounding at world 3, and is two orders below what a bfloat16 wire
# (~1e-3) or a wrong lr, momentum, shard or owner gives.
TOLERANCE = 2e-5

MODES = [("local", 1), ("fsdp2", 3), ("ddp", 2), ("hsdp", 4), ("gather", 3), ("ownership", 2),
         ("ownership_mixed", 2), ("fsdp2_float64_blocks", 3)]


@pytest.mark.parametrize("mode,world", MODES, ids=[m for m, _ in MODES])
def test_mode_gives_the_reference_update(mode, world):
    results = run_distributed(all_modes_workers.mode_matches_reference, world, mode)
    assert sorted(results) == list(range(world))
    for rank, result in results.items():
        assert result["world"] == world, (rank, result["world"])
        # The step engine runs every mode; in the ownership modes its parameters are the owned
        # matrices (all four, or the first two) and the others.
        assert result["runtime"] == "EngineRuntime", (rank, result["runtime"])
        expected = {"ownership": (4, 4), "ownership_mixed": (2, 4)}.get(mode, (0, 4))
        assert (result["num_owned"], result["num_engine_params"]) == expected, (mode, rank, result)
        for name, error in result["errors"].items():
            assert error < TOLERANCE, (mode, rank, name, error)
