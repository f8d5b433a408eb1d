"""Long runs stay flat on the CPU: momentum entries whose gradient has become zero decay by μ
each step into float32's subnormal range (from about step 1,500 at μ = 0.95), where every
operation on them is many times slower unless the step flushes subnormals to zero
(csrc/step/cpu/flush_denormals.h). Catches: the flush removed, or set on the calling thread
only while the NS chunks run on ATen's pool (their per-step time then grows 5–7×)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn

import dmuon

NUM_STEPS = 3000
WINDOW = 100
WARMUP = 20


@pytest.mark.slow
def test_cpu_step_time_stays_flat_after_momentum_decays_into_subnormals():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False))
    opt = dmuon.DMuon(model, lr=1e-3, momentum=0.95, weight_decay=0.0)
    x, target = torch.randn(16, 64), torch.randn(16, 64)
    # NOTE: from step 10 the inputs' last 32 features are zero, so the first matrix's last
    # 32 columns get exactly zero gradients and their momentum only decays: ~1e-3 at step
    # 10, subnormal (< 1.18e-38) from about step 1,600.
    quiet = x.clone()
    quiet[:, 32:] = 0
    seconds = []
    for step in range(NUM_STEPS):
        inputs = x if step < 10 else quiet
        loss = nn.functional.mse_loss(model(inputs), target)
        opt.zero_grad()
        loss.backward()
        begin = time.perf_counter()
        opt.step()
        seconds.append(time.perf_counter() - begin)
    momentum = opt.state[model[0].weight]["momentum_buffer"][:, 32:]
    # The decayed entries reached zero through the subnormal range (0.95^3000 of 1e-3 is
    # far below it), and the run is the one the test means.
    assert torch.count_nonzero(momentum) == 0
    first = statistics.median(seconds[WARMUP:WARMUP + WINDOW])
    last = statistics.median(seconds[-WINDOW:])
    assert last <= 1.5 * first, f"per-step time grew from {first * 1e3:.3f} ms to {last * 1e3:.3f} ms"
