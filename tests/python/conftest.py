"""Shared pytest setup: deterministic seeds and the `gpu` marker's skip."""

from __future__ import annotations

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
