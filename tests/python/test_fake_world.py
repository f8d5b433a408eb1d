"""DMuon over torch's fake process group (the step engine): every rank of fake worlds of 2,
3 and 8 in turn in this process. Each matrix is orthogonalized once, by its planned owner;
each rank's counted bytes are those of its shards and owned matrices, and so are the
projection's stage layout's for every rank; the agreements follow the model "every rank
behaves like this one"; the plan computed alone equals the broadcast one on Gloo; work that
needs data from other ranks is refused by name."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_distributed
from fake_world_workers import (SHAPES, analytic_bytes, fake_rank_step, gloo_local_and_broadcast_plans,
                                gloo_local_plans_that_differ, matrices_of)


@pytest.mark.parametrize("world", [2, 3, 8])
def test_every_matrix_is_orthogonalized_once_by_its_owner_and_bytes_follow_the_shards(world):
    from dmuon._ops import _C

    runs = [fake_rank_step(rank, world, "owner") for rank in range(world)]
    assert all("error" not in run for run in runs), [run.get("error") for run in runs]
    assert {run["transport"] for run in runs} == {"fake"}
    owners = runs[0]["owners"]
    num_matrices = len(matrices_of(SHAPES, world))
    # Every rank planned alone and they agree; every rank owns something at these sizes.
    assert all(run["owners"] == owners for run in runs) and len(owners) == num_matrices
    assert sorted(set(owners)) == list(range(min(world, num_matrices)))
    done = [(idx, rank) for rank, run in enumerate(runs) for idx in run["orthogonalized"]]
    assert sorted(idx for idx, _ in done) == list(range(num_matrices)), done
    assert all(owners[idx] == rank for idx, rank in done), (owners, done)
    topology = _C.sim.Topology.two_level(world, 8, intra_bytes_per_s=1e9, inter_bytes_per_s=1e8,
                                         intra_latency_s=0.0, inter_latency_s=0.0)
    modelled = _C.sim.rank_traffic(runs[0]["layout"], topology)
    for rank, run in enumerate(runs):
        expected = analytic_bytes(SHAPES, owners, rank, world, "owner")
        assert (run["bytes_sent"], run["bytes_received"]) == expected, rank
        assert (modelled[rank].sent, modelled[rank].received) == expected, rank
        # The layout's bytes per peer are what this rank's engine counted in each stage.
        layout = run["layout"]
        for s, stage in enumerate(run["stage_stats"]):
            sent = [layout.forward_bytes[s][rank * world + d] for d in range(world)]
            received = [layout.forward_bytes[s][src * world + rank] for src in range(world)]
            assert (stage["forward_sent_to"], stage["forward_received_from"]) == (sent, received), (rank, s)
            sent = [layout.return_bytes[s][rank * world + d] for d in range(world)]
            received = [layout.return_bytes[s][src * world + rank] for src in range(world)]
            assert (stage["return_sent_to"], stage["return_received_from"]) == (sent, received), (rank, s)
        # The step ran on defined data: every shard changed and stayed finite.
        assert run["all_finite"] and run["all_changed"], rank


@pytest.mark.parametrize("world", [2, 3, 8])
def test_gather_mode_orthogonalizes_everything_on_every_rank(world):
    runs = [fake_rank_step(rank, world, "gather") for rank in range(world)]
    for rank, run in enumerate(runs):
        assert "error" not in run, run.get("error")
        assert sorted(run["orthogonalized"]) == list(range(len(matrices_of(SHAPES, world))))
        assert (run["bytes_sent"], run["bytes_received"]) == analytic_bytes(SHAPES, [], rank, world, "gather")
        assert run["all_finite"] and run["all_changed"]


def test_the_runtime_records_each_stages_phases_when_asked():
    run = fake_rank_step(1, 3, "owner")
    # The test worker does not ask for the timeline: none is kept.
    assert run["bucket_times"] == [] and run["num_buckets"] > 1
    assert len(run["stage_stats"]) == run["num_buckets"] == run["layout"].num_stages


def test_a_non_finite_gradient_on_a_fake_rank_is_reported_by_name():
    # NOTE: the gradient check's agreement is modelled (sum: local x D), so the NaN on this
    # rank is every rank's NaN: the step raises, naming the parameter, and changes nothing.
    run = fake_rank_step(0, 4, "owner", nan_param=3)
    assert run["error"].startswith("NonFiniteGradientError") and "'w3'" in run["error"], run


def test_the_weight_ownership_mode_is_refused_on_a_fake_world():
    import dmuon
    from torch.distributed.device_mesh import init_device_mesh

    from dmuon.bench.fake_world import fake_rank

    with fake_rank(1, 4):
        mesh = init_device_mesh("cpu", (4,))
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        with pytest.raises(RuntimeError, match="weight-ownership mode .* cannot run over torch's fake"):
            dmuon.own_matrices(model, mesh)


@pytest.mark.parametrize("solver", ["lpt", "milp"])
def test_the_plan_each_rank_computes_alone_equals_the_broadcast_one_on_gloo(solver):
    results = run_distributed(gloo_local_and_broadcast_plans, 3, solver)
    broadcast = results[0]["broadcast"]
    assert len(set(broadcast["owners"])) == 3
    for rank, result in results.items():
        assert result["broadcast"] == broadcast, rank
        assert result["local"] == broadcast, rank


@pytest.mark.parametrize("differs", ["costs", "buckets"])
def test_ranks_that_decide_differently_fail_by_name_on_every_rank(differs):
    # NOTE: the plan's fingerprint covers the problem (costs included), the owners and
    # batches, and the options the stages and the order of collectives come from; the cost
    # model is checked against rank 0's where its table is shared.
    errors = run_distributed(gloo_local_plans_that_differ, 3, differs)
    for rank, error in errors.items():
        if differs == "costs" and rank == 1:
            assert ("the cost model differs between ranks: rank 0 plans with the analytic model, rank 1 measures "
                    "them (every rank must pass the same cost_model)") in error, (rank, error)
        elif differs == "costs":
            assert "planning owners failed on another rank" in error, (rank, error)
        else:
            assert f"the owner plan differs between ranks (rank {rank} holds plan hash" in error, (rank, error)
            assert "every rank must pass the same parameters and options" in error, (rank, error)
