"""Long runs stay flat on the CPU: momentum entries whose gradient has become zero decay by μ
each step into float32's subnormal range (from about step 770 at μ = 0.9) and stay there
(μ·m rounds back to m), where every operation on them is many times slower unless the step
flushes subnormals to zero (csrc/step/cpu/flush_denormals.h). Catches: the flush removed
(2,048 subnormal momentum entries at the end; the per-step time grows several times where
the CPU pays for subnormals: 5–7× measured on one; on an AMD EPYC it did not, 0.98×)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import dmuon

NUM_STEPS = 1500
WINDOW = 100
WARMUP = 20


@pytest.fixture
def one_thread():
    # NOTE: ATen's two pool threads on a loaded shared machine made each training step 18 ms
    # instead of 0.8 ms (measured): one thread keeps the test within seconds.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cpu_step_time_stays_flat_after_momentum_decays_into_subnormals(one_thread):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False))
    opt = dmuon.DMuon(model, lr=1e-3, momentum=0.9, weight_decay=0.0)
    x, target = torch.randn(16, 64), torch.randn(16, 64)
    # NOTE: from step 10 the inputs' last 32 features are zero, so the first matrix's last
    # 32 columns get exactly zero gradients and their momentum only decays: ~1e-3 at step
    # 10, below float32's smallest normal (1.18e-38) from about step 770.
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
    # The run is the one the test means: the decayed entries reached the bottom of the
    # normal range, and none is subnormal (flushed, a decrement (1 − μ)·m below it is 0, so
    # they stop near 1.2e-37).
    assert momentum.abs().max() < 1e-35
    assert not torch.any((momentum != 0) & (momentum.abs() < torch.finfo(torch.float32).tiny))
    # NOTE: the fastest step of each window: load on the machine only adds time, while
    # subnormals slow every step of the window.
    first = min(seconds[WARMUP:WARMUP + WINDOW])
    last = min(seconds[-WINDOW:])
    assert last <= 1.5 * first, f"per-step time grew from {first * 1e3:.3f} ms to {last * 1e3:.3f} ms"
