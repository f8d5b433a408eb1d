"""accelerate's real FSDP2 ``prepare`` (``accelerator.prepare(model, DMuon(model))``, which puts
a fresh parameter object into the module and into param_groups) changes nothing in DMuon's
update: GPT-2 (HF Conv1D, transposed) with an nn.MultiheadAttention (q, k, v orthogonalized
apart) trains to the weights of the same run sharded by plain ``fully_shard``, on one process
(world 1: Gloo on the CPU, NCCL on one GPU). Reference: that plain run; CPU bit for bit, GPU
within 1e-6 of the weights (the swap reproducer moved GPT-2 by 2.6e-2 in 6 steps)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import dmuon  # noqa: E402
from dist_harness import run_distributed  # noqa: E402

import accelerate_workers  # noqa: E402


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
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
