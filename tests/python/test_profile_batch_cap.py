"""The planner's cost profile times only batches a step can form (timing a batch of all 28
MLP matrices of Qwen2.5-7B at once made its first step peak at 56.5 GB)."""

import pytest
import torch

import dmuon._ops  # noqa: F401  (registers torch.ops.dmuon)
from dmuon.plan.profile import _within_step_batches, batch_sizes

capacity = getattr(torch.ops.dmuon, "cuda_ns_batch_capacity", None)
pytestmark = pytest.mark.skipif(capacity is None, reason="built without the CUDA NS backend")


def test_capacity_is_the_largest_batch_within_the_ns_workspace_bound():
    # Host arithmetic only (no GPU): bigger matrices fit fewer to a batch, and a matrix too
    # big for the bound still gets a batch of one.
    big, medium, small = capacity("gram", 3584, 18944), capacity("gram", 3584, 3584), capacity("gram", 512, 3584)
    assert 1 <= big < medium < small
    assert capacity("gram", 18944, 3584) == big  # tall matrices iterate transposed
    assert capacity("gram", 152064, 3584) == 1


def test_profiled_points_are_capped_and_deduplicated_on_cuda_only():
    points = [(3584, 18944, b) for b in batch_sizes(28)]
    cap = capacity("gram", 3584, 18944)
    capped = _within_step_batches(points, torch.device("cuda"), "gram")
    assert max(n for _, _, n in capped) == cap
    assert [n for _, _, n in capped] == [min(n, cap) for _, _, n in points]
    assert _within_step_batches(points, torch.device("cpu"), "gram") == points


def test_bad_shapes_and_algorithms_are_named():
    with pytest.raises(RuntimeError, match="rows and cols must be >= 1"):
        capacity("gram", 0, 8)
    with pytest.raises(RuntimeError, match="nonsense"):
        capacity("nonsense", 8, 8)
