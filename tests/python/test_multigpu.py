"""The CPU suite's distributed checks over NCCL, one process per GPU (marker multigpu; each
world size only where that many GPUs are visible): sharded (FSDP2's DTensor Shard(0) with
uneven and empty shards, a 3-D expert stack, a conv weight), replicated, gather mode, HSDP,
FSDP2 fully_shard and DDP training, the shared profiled plan, NaN/Inf agreement and
mismatched parameter lists, against single-process DMuon on the same GPU; and the step begun
inside backward against the post-backward step (FSDP2, DDP, HSDP, 3 micro-batches, a NaN in
the last layer).

Tolerances: the CPU suite's 1e-5 wherever the inputs are the same (float32 on the wire, see
dist_workers._exact_options). Two checks differ by construction, and say so:
- FSDP2/DDP training: split-batch gradients differ from the whole batch's in the last bits,
  so the check is on the update (the change of each parameter over the run) within 1e-5 of
  the single-process update, with a float64 model (see
  dist_workers.wrapped_training_matches_single_process for why not float32 on GPUs);
- production precision (bfloat16 wire, the GPU default): each step's update within 15% of
  the single-process update. float16 Newton–Schulz alone is up to ~4% from exact on these
  shapes (measured with dmuon.reference in float16: worst 3.8% over 50 draws) and the
  bfloat16 rounding of the input moves it by as much; a misplaced or missing shard moves it
  by ~100%. An error every run shares (an lr off by 1%) is checked against the float64
  reference instead: the update's least-squares scale over every parameter within
  LR_SCALE_TOLERANCE of 1 (dist_workers._lr_scale), as for HSDP.

All scenarios of one world size run in one launch (dist_workers.all_scenarios): NCCL start
up costs seconds per process group, and the multi-GPU run has minutes, not hours. The ranks
run with DMUON_AUTOTUNE=0: autotuning times kernel configurations in each process, so two
ranks may pick different ones for one shape and differ in the last float16 bits, which is
not what these checks are about (the untuned defaults are the same in every process).
The single-process reference and the distributed step both run the step engine (every
SHAPES entry is distinct, so each NS batch holds the same matrices on either side).
"""

from __future__ import annotations

import os

import pytest
import torch

import dist_workers
from dist_harness import run_distributed
from test_distributed import (TOLERANCE, check_hsdp, check_mismatched, check_nonfinite, check_production,
                              check_profiled, check_sharded, check_training)

pytestmark = pytest.mark.multigpu

WORLDS = [2, 4, 8]
TRAINING_UPDATE_TOLERANCE = TOLERANCE
# Weight-ownership training keeps the float32 model (float16 Newton–Schulz on both sides).
OWNERSHIP_UPDATE_TOLERANCE = 1e-2
PRODUCTION_UPDATE_TOLERANCE = 0.15

# world -> {rank: {scenario: result}} or the AssertionError of a failed launch.
_RUNS: dict[int, object] = {}


def _suite(world: int) -> dict[int, dict]:
    """Every scenario at `world` (launched once per world size, then cached)."""
    num_gpus = torch.cuda.device_count()
    if num_gpus < world:
        pytest.skip(f"world {world} needs {world} GPUs, found {num_gpus}")
    if world not in _RUNS:
        # NOTE: spawned ranks copy the environment when they start; the parent's is restored.
        overrides = {"DMUON_AUTOTUNE": "0"}
        previous = {key: os.environ.get(key) for key in overrides}
        os.environ.update(overrides)
        try:
            _RUNS[world] = run_distributed(dist_workers.all_scenarios, world, backend="nccl",
                                           timeout_s=300, collective_timeout_s=60)
        except AssertionError as error:
            _RUNS[world] = error
        finally:
            for key, value in previous.items():
                if value is None:
                    del os.environ[key]
                else:
                    os.environ[key] = value
    if isinstance(_RUNS[world], AssertionError):
        raise _RUNS[world]
    return _RUNS[world]


def _scenario(world: int, name: str) -> dict[int, dict]:
    """{rank: result} of one scenario; a scenario that raised fails with its traceback."""
    results = {rank: by_name[name] for rank, by_name in _suite(world).items()}
    for rank, result in results.items():
        assert not (isinstance(result, dict) and "error" in result), f"rank {rank}:\n{result['error']}"
    return results


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ["gram", "standard"])
def test_sharded_replicated_and_gather_match_single_process(world, algorithm):
    check_sharded(_scenario(world, f"sharded-{algorithm}"), world)


@pytest.mark.parametrize("world", [w for w in WORLDS if w >= 4])
def test_hsdp_mesh_matches_single_process(world):
    check_hsdp(_scenario(world, "hsdp"))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("wrapper", ["fsdp2", "ddp"])
def test_fsdp2_and_ddp_training_match_single_process(world, wrapper):
    check_training(_scenario(world, wrapper), "update_errors", TRAINING_UPDATE_TOLERANCE)


@pytest.mark.parametrize("world", WORLDS)
def test_profiled_cost_table_gives_one_plan(world):
    check_profiled(_scenario(world, "profiled-plan"))


@pytest.mark.parametrize("world", WORLDS)
def test_nonfinite_gradient_raises_or_is_skipped_on_every_rank(world):
    check_nonfinite(_scenario(world, "nonfinite-raise"), _scenario(world, "nonfinite-skip"))


@pytest.mark.parametrize("world", WORLDS)
def test_mismatched_parameter_lists_fail_on_every_rank(world):
    check_mismatched(_scenario(world, "mismatched"))


@pytest.mark.parametrize("world", WORLDS)
def test_bfloat16_wire_and_half_precision_stay_close_to_single_process(world):
    results = _scenario(world, "production")
    # The wire is bfloat16: gather mode sends each local row block to world − 1 ranks.
    assert all(r["wire_element_size"] == 2 for r in results.values())
    check_production(results, world, PRODUCTION_UPDATE_TOLERANCE)


# ------------------------------------------------------------ the step begun inside backward
# NOTE: the same plan, gradients and kernels on either side (DMUON_AUTOTUNE=0, float32 wire
# where the scenario sets none): only the stages' composition differs, which on the GPU can
# change an NS batch's size and so its kernel's rounding: bounded by the float16 NS, 1e-2.
BACKWARD_STEP_TOLERANCE = 1e-2


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", ["fsdp2", "ddp", "accumulate", "hsdp"])
def test_backward_step_over_nccl_matches_the_post_backward_step(world, case):
    if case == "hsdp" and world < 4:
        pytest.skip("HSDP needs a 2 × (world / 2) mesh")
    for rank, result in _scenario(world, f"backward-step-{case}").items():
        assert result["backward_on"] and not result["off"], (rank, result)
        for name, error in result["errors"].items():
            assert error < BACKWARD_STEP_TOLERANCE, (case, rank, name, error)
        for early_stages, stages, _, _ in result["early"][1:]:
            assert 0 < early_stages <= stages, result["early"]


@pytest.mark.parametrize("world", WORLDS)
def test_backward_step_nan_in_a_late_layer_over_nccl(world):
    for rank, result in _scenario(world, "backward-step-nan").items():
        assert result["early_open"] and result["unchanged"], (rank, result)
        assert "non-finite gradient" in result["error"] and "layers.3.weight" in result["error"], (rank, result)


# ------------------------------------------------------------ weight-ownership mode
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("wrapper", ["fsdp2", "dp"])
def test_weight_ownership_mode_over_nccl(world, wrapper):
    """dmuon.own_matrices over NCCL (publish broadcasts, all_to_all reduce-to-owner, NS on a
    side stream under backward) against single-process DMuon on the same GPU: the update
    within the training tolerance (split-batch gradients, float16 Newton–Schulz)."""
    import test_ownership

    num_gpus = torch.cuda.device_count()
    if num_gpus < world:
        pytest.skip(f"world {world} needs {world} GPUs, found {num_gpus}")
    results = run_distributed(test_ownership.ownership_matches_single_process, world, wrapper,
                              backend="nccl", timeout_s=300, collective_timeout_s=60)
    for rank, result in results.items():
        for name, error in result["update_errors"].items():
            assert error < OWNERSHIP_UPDATE_TOLERANCE, (rank, name, error)
        assert result["freed_again"], rank
