"""MoE routing like dense: a fused expert stack gate_up_proj [E, 2I, H] is orthogonalized per
expert as its gate and up matrices (bit for bit what separately held gate and up stacks get,
on one process and sharded by FSDP2 over 2 Gloo ranks), and a 1×H gate goes to AdamW."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import dmuon
import moe_models
from dist_harness import run_distributed
from worker_tensors import reference_of

E, H, I = moe_models.EXPERTS, moe_models.HIDDEN, moe_models.INNER


def routes(routed):
    return {r.name: r for r in routed}


def test_fused_gate_up_splits_per_expert_and_a_one_row_gate_goes_to_adamw_by_module_and_by_names():
    fused, _ = moe_models.pair()
    for by in (routes(dmuon.route_module(fused)), routes(dmuon.routing.route_named(list(fused.named_parameters())))):
        gate_up = by["experts.gate_up_proj"]
        assert gate_up.use_muon and gate_up.batch_dims == 1 and gate_up.row_blocks == (I, I)
        assert "gate and up orthogonalized separately" in gate_up.reason
        down = by["experts.down_proj"]
        assert down.use_muon and down.batch_dims == 1 and down.row_blocks == ()
        gate = by["shared_expert_gate.weight"]
        assert not gate.use_muon and "one row or column" in gate.reason
    summary = str(dmuon.DMuon(fused).routing_summary())
    assert "shared_expert_gate.weight" in summary and "one row or column" in summary


def test_gate_up_stored_in_out_is_not_split():
    """The [E, H, 2I] layout (gpt-oss, Llama 4) has no down_proj [E, H, I] beside it that
    fits the [E, 2I, H] reading: one matrix per expert, as before."""
    experts = nn.Module()
    experts.gate_up_proj = nn.Parameter(torch.randn(E, H, 2 * I))
    experts.down_proj = nn.Parameter(torch.randn(E, I, H))
    model = nn.Module()
    model.experts = experts
    assert routes(dmuon.route_module(model))["experts.gate_up_proj"].row_blocks == ()


def test_one_row_or_column_matrices_go_to_adamw_by_names_and_stay_on_muon_bare():
    """Named, an [N, 1] matrix too; a bare tensor's role is unknown: its shape decides (Muon)."""
    pairs = [("gate.weight", torch.randn(1, 8)), ("score_proj.weight", torch.randn(8, 1)), ("w.weight", torch.randn(4, 8)),
             ("tok_embeddings.weight", torch.randn(16, 8))]
    assert [r.use_muon for r in dmuon.routing.route_named(pairs)] == [False, False, True, False]
    routed = dmuon.routing.route_params([torch.randn(1, 8), torch.randn(4, 8)], "params", warn=False)
    assert [r.use_muon for r in routed] == [True, True]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_fused_gate_up_steps_bit_for_bit_as_separate_gate_and_up_stacks(device):
    """On CUDA the same [I, H] matrices meet in the same batches either way (2E of them)."""
    fused, split = (m.to(device) for m in moe_models.pair(seed=1))
    inputs = lambda step: torch.randn(6, H, generator=torch.Generator().manual_seed(step)).to(device)  # noqa: E731
    moe_models.train_pair(fused, split, 4, lambda m: dmuon.DMuon(m, lr=0.05, weight_decay=0.1), inputs)
    gate, up = fused.experts.gate_up_proj.detach().chunk(2, dim=1)
    assert torch.equal(gate, split.experts.gate_proj.detach())
    assert torch.equal(up, split.experts.up_proj.detach())
    assert torch.equal(fused.experts.down_proj, split.experts.down_proj)


def test_fused_gate_up_matches_the_reference_per_block():
    """Against the pure-PyTorch reference in float64 (row blocks of every matrix of the stack)."""
    fused, _ = moe_models.pair(seed=2)
    fused = fused.double()
    exact = moe_models.MoEBlock(moe_models.FusedExperts()).double()
    exact.load_state_dict(fused.state_dict())
    optimizer = dmuon.DMuon(fused, lr=0.05, weight_decay=0.0)
    reference = reference_of(optimizer, exact)
    x = torch.randn(6, H, dtype=torch.float64)
    for m in (fused, exact):
        m(x).square().mean().backward()
    optimizer.step()
    reference.step()
    for (name, p), q in zip(fused.named_parameters(), exact.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)


def test_fused_gate_up_sharded_by_fsdp2_steps_as_separate_stacks():
    results = run_distributed(fused_and_split_under_fsdp2, 2)
    for out in results.values():
        assert torch.equal(out["fused"], out["split"])


# ---------------------------------------------------------------- on the ranks
# The fused and the split MoE blocks under FSDP2, each expert stack Shard(0) over the ranks.
def fused_and_split_under_fsdp2(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    fused, split = moe_models.pair(seed=3)
    for block in (fused, split):
        fully_shard(block, mesh=mesh)
    inputs = lambda step: torch.randn(6, moe_models.HIDDEN, generator=torch.Generator().manual_seed(100 * step + rank))
    moe_models.train_pair(fused, split, 3, lambda m: dmuon.DMuon(m, lr=0.05, weight_decay=0.1), inputs)
    full = lambda p: p.full_tensor().detach().clone()  # noqa: E731
    gate, up = full(fused.experts.gate_up_proj).chunk(2, dim=1)
    dist.barrier()
    return {"fused": torch.cat([gate, up]), "split": torch.cat([full(split.experts.gate_proj),
                                                                full(split.experts.up_proj)])}
