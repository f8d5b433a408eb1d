"""Shared pytest setup: deterministic seeds, the `gpu` marker's skip, small helpers."""

from __future__ import annotations

import copy

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    # Tests marked gpu/multigpu skip where the hardware is absent (CI has no GPU).
    num_gpus = torch.cuda.device_count()
    for item in items:
        if "gpu" in item.keywords and num_gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and num_gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs several CUDA GPUs"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def reference_groups(optimizer, params_by_id: dict[int, torch.Tensor]) -> list[dict]:
    """DMuon's param groups re-pointed at other parameters (a cloned model) for ReferenceDMuon."""
    groups = []
    for group in optimizer.param_groups:
        g = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
        g["params"] = [params_by_id[id(p)] for p in group["params"]]
        g["batch_dims"] = [optimizer._params.batch_dims(p) for p in group["params"]]
        groups.append(g)
    return groups
