"""accelerate's real FSDP2 ``prepare`` (``accelerator.prepare(model, DMuon(model))``, which puts
a fresh parameter object into the module and into param_groups) changes nothing in DMuon's
update: GPT-2 (HF Conv1D, transposed) with an nn.MultiheadAttention (q, k, v orthogonalized
apart) trains to the weights of the same run sharded by plain ``fully_shard``, on one process
(world 1: Gloo on the CPU, NCCL on one GPU). Reference: that plain run; CPU bit for bit, GPU
within 1e-6 of the weights (the swap reproducer moved GPT-2 by 2.6e-2 in 6 steps). The HF
Trainer's FSDP2 path through dmuon.integrations.hf.create_optimizer too (GPU only: the Trainer
enables FSDP only on accelerators)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import dmuon  # noqa: E402
from dist_harness import run_distributed  # noqa: E402

import accelerate_workers  # noqa: E402


# NOTE: the CPU case forces accelerate's FSDP2 state onto CPU processes (accelerate_workers);
# where a GPU is present, that forced path shards the blocks and the root over two process
# groups (DMuon refuses Muon parameters on two groups, naming them), so there the CUDA case
# runs instead.
_CPU_CASE = pytest.param("cpu", marks=pytest.mark.skipif(
    torch.cuda.is_available(), reason="a GPU is present: the cuda case covers accelerate's FSDP2 prepare here"))


@pytest.mark.parametrize("device", [_CPU_CASE, pytest.param("cuda", marks=pytest.mark.gpu)])
def test_accelerate_fsdp2_prepare_trains_as_plain_fully_shard(device):
    result = run_distributed(accelerate_workers.plain_and_accelerate, 1, device,
                             backend="nccl" if device == "cuda" else "gloo", fresh=True)[0]
    assert result["replaced"]  # prepare gave DMuon's param_groups other objects than it was made with
    assert result["names"] == {accelerate_workers.CONV1D, accelerate_workers.IN_PROJ}
    assert result["conv1d_view"] == dmuon.MatrixView(transposed=True)
    assert result["in_proj_view"] == dmuon.MatrixView(row_blocks=(accelerate_workers.DIM,) * 3)
    tolerance = dict(rtol=0.0, atol=0.0) if device == "cpu" else dict(rtol=0.0, atol=1e-6)
    for name, plain in result["plain"].items():
        plain, initial = torch.from_numpy(plain), torch.from_numpy(result["initial"][name])
        assert not torch.equal(plain, initial), name  # it trained
        torch.testing.assert_close(torch.from_numpy(result["weights"][name]), plain, **tolerance, msg=name)


@pytest.mark.gpu
def test_trainer_create_optimizer_under_fsdp2_trains_as_unsharded(tmp_path):
    """dmuon.integrations.hf.create_optimizer(trainer) with the Trainer's FSDP2 (DMuon made
    from the model, then prepared with it) against the same Trainer run unsharded (DDP, the
    parameters kept). NOTE: a Conv1D that lost its transposition here moves its weights by
    about 1e-3 a step (lr 1e-2, ratio 2 against 1); the two runs' transports differ, hence 1e-5."""
    result = run_distributed(accelerate_workers.trainer_with_and_without_fsdp2, 1, "cuda", str(tmp_path),
                             backend="nccl", fresh=True)[0]
    plain, sharded = result["plain"], result["fsdp2"]
    assert sharded["replaced"] and not plain["replaced"]
    assert sharded["conv1d_name"] == plain["conv1d_name"] == accelerate_workers.CONV1D.removeprefix("gpt2.")
    assert sharded["conv1d_view"] == plain["conv1d_view"] == dmuon.MatrixView(transposed=True)
    for name, weight in plain["weights"].items():
        torch.testing.assert_close(torch.from_numpy(sharded["weights"][name]), torch.from_numpy(weight),
                                   rtol=0.0, atol=1e-5, msg=name)
