"""Checkpoints through torch.distributed.checkpoint move across world sizes and wrappers:
save under FSDP2 at world 4 (or DDP), load at world 2, 3, 1 (or FSDP2), train 3 more
steps, and land on the uninterrupted trajectory (CPU fp32: within 1e-6 relative); at the
same world size resumed training is bitwise identical. The ownership plan is not saved:
every load recomputes it for the new world."""

from __future__ import annotations

import numpy as np
import pytest

import checkpoint_workers
from dist_harness import run_distributed


def max_relative_error(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.linalg.norm(a[n] - b[n]) / np.linalg.norm(b[n])) for n in b)


@pytest.fixture(scope="module")
def fsdp2_world4_checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt_fsdp2_w4"))
    reference = run_distributed(checkpoint_workers.save_then_continue, 4, "fsdp2", path)[0]
    return path, reference


@pytest.mark.parametrize("world, wrapper", [(4, "fsdp2"), (2, "fsdp2"), (3, "fsdp2"), (1, "none"), (2, "ddp")],
                         ids=["4-fsdp2-bitwise", "2-fsdp2", "3-fsdp2", "1-single", "2-ddp"])
def test_fsdp2_world4_checkpoint_resumes_anywhere(fsdp2_world4_checkpoint, world, wrapper):
    path, reference = fsdp2_world4_checkpoint
    resumed = run_distributed(checkpoint_workers.load_then_continue, world, wrapper, path)[0]
    error = max_relative_error(resumed, reference)
    if world == 4:
        assert error == 0.0  # exact resume: bitwise at the same world size
    else:
        assert error < 1e-6, error


def test_ddp_checkpoint_resumes_under_fsdp2(tmp_path):
    path = str(tmp_path / "ckpt_ddp")
    reference = run_distributed(checkpoint_workers.save_then_continue, 2, "ddp", path)[0]
    resumed = run_distributed(checkpoint_workers.load_then_continue, 2, "fsdp2", path)[0]
    assert max_relative_error(resumed, reference) < 1e-6


def test_full_state_dict_with_cpu_offload_round_trip(tmp_path):
    path = str(tmp_path / "full.pt")
    reference = run_distributed(checkpoint_workers.save_then_continue, 2, "fsdp2", path, True)[0]
    resumed = run_distributed(checkpoint_workers.load_then_continue, 2, "fsdp2", path, True)[0]
    assert max_relative_error(resumed, reference) < 1e-6
