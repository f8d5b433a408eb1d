"""The one-GPU step (the step engine's CUDA ops, csrc/step/cuda, marker gpu): whole
matrices on one GPU go through check → momentum and normalization → batched Newton–Schulz
→ apply behind one device-side gate. It must agree with the float64 reference, step float64
parameters in float64 (the ATen path, engine/aten_float64_ops.h), be deterministic, split
batches under a small workspace bound without changing the result beyond half-precision
rounding, and keep the NaN/Inf policy.

Tolerances: runs that may tune other kernel configurations (other processes, streams, batch
splits) allow 2e-2. Momentum buffers: the engine's lerp in float32 against ATen's: 1e-6.
Float64 parameters against the float64 reference: 1e-10 (the same arithmetic, other sums).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import dmuon
from dmuon.reference import ReferenceDMuon

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Wide, tall, square, odd (cols % 4 != 0, padded rows), tiny, and a 3-D stack of matrices.
# NOTE: tall ones with cols % 4 == 0 take the vectorized transposing kernels ((96, 64),
# (200, 68): a last tile column of one float4, (300, 132)); (130, 66) the scalar ones.
SHAPES = [(64, 96), (96, 64), (127, 301), (130, 66), (5, 7), (3, 40, 72), (256, 256), (200, 68), (300, 132)]

# One process: builds the model from a seed, runs 3 steps in two param groups (Gram with
# Nesterov and decay; standard without Nesterov, adjusted lr), prints parameters' and
# buffers' per-step deltas as JSON.
_RUN = textwrap.dedent("""
    import json, sys, torch, dmuon
    shapes = json.loads(sys.argv[1])
    torch.manual_seed(0)
    params = [torch.nn.Parameter((torch.randn(*s) / s[-1] ** 0.5).cuda()) for s in shapes]
    half = len(params) // 2
    opt = dmuon.DMuon([dict(params=params[:half], weight_decay=0.1),
                       dict(params=params[half:], ns_algorithm="standard", nesterov=False, adjust_lr="match_rms_adamw")],
                      lr=0.02)
    deltas = []
    for step in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
        before = [p.detach().clone() for p in params]
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
        deltas.append([(p.detach() - b).double().cpu().flatten().tolist() for p, b in zip(params, before)])
    buffers = [opt.state[p]["momentum_buffer"].double().cpu().flatten().tolist() for p in params]
    stats = opt.runtime.last_stats
    print(json.dumps({"deltas": deltas, "buffers": buffers, "orthogonalized": stats.num_orthogonalized,
                      "streams": stats.num_fused_streams, "batches": [list(b) for b in stats.fused_batches]}))
""")


def run_path(env: dict[str, str], shapes=SHAPES, steps: int = 3, path: str = "engine") -> dict:
    out = subprocess.run([sys.executable, "-c", _RUN, json.dumps(shapes), str(steps), path], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def rel(a, b) -> float:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


@needs_gpu
def test_float64_parameters_step_in_float64():
    # Every shape (a stack included) in float64 on the GPU: the engine's ATen float64 path
    # against the float64 reference, three steps, two groups.
    torch.manual_seed(0)
    initial = [torch.randn(*s, dtype=torch.float64) / s[-1] ** 0.5 for s in SHAPES]
    params = [torch.nn.Parameter(x.cuda()) for x in initial]
    exact_p = [torch.nn.Parameter(x.clone()) for x in initial]
    half = len(params) // 2
    opt = dmuon.DMuon([dict(params=params[:half], weight_decay=0.1),
                       dict(params=params[half:], ns_algorithm="standard", nesterov=False, adjust_lr="match_rms_adamw")],
                      lr=0.02)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    exact = ReferenceDMuon([dict(groups[0], params=exact_p[:half]), dict(groups[1], params=exact_p[half:])])
    for _ in range(3):
        for p, e in zip(params, exact_p):
            g = torch.randn(p.shape, dtype=torch.float64)
            p.grad, e.grad = g.cuda(), g.clone()
        opt.step()
        exact.step()
    for i, (p, e, x) in enumerate(zip(params, exact_p, initial)):
        d, d_exact = p.detach().cpu() - x, e.detach() - x
        assert rel(d.flatten().tolist(), d_exact.flatten().tolist()) <= 1e-10, SHAPES[i]
    assert opt.runtime.last_stats.num_orthogonalized == len(SHAPES) + 2


@needs_gpu
def test_batches_on_several_streams_match_one_stream():
    # Steps 1–2 on one stream (a batch's first runs tune and capture), steps 3–5 on
    # DMUON_FUSED_STREAMS streams (the step engine's warm-batch rule). The same
    # kernels on other streams: equal up to the configurations each process tunes.
    one = run_path({"DMUON_FUSED_STREAMS": "1"}, steps=5)
    three = run_path({"DMUON_FUSED_STREAMS": "3"}, steps=5)
    assert one["streams"] == 1 and three["streams"] == 3
    for step, (d1, d3) in enumerate(zip(one["deltas"], three["deltas"])):
        for i, (a, b) in enumerate(zip(d1, d3)):
            assert rel(b, a) <= 2e-2, (step, SHAPES[i], rel(b, a))
    for i, (a, b) in enumerate(zip(one["buffers"], three["buffers"])):
        assert rel(b, a) <= 1e-6, (SHAPES[i], rel(b, a))


@needs_gpu
@pytest.mark.parametrize("value", ["0", "9", "two"])
def test_a_bad_stream_count_is_named(value):
    out = subprocess.run([sys.executable, "-c", _RUN, json.dumps(SHAPES), "3"], capture_output=True, text=True,
                         env={**os.environ, "DMUON_FUSED_STREAMS": value}, timeout=600)
    assert out.returncode != 0
    assert "DMUON_FUSED_STREAMS" in out.stderr, out.stderr[-2000:]


@needs_gpu
def test_fused_batches_split_under_a_small_workspace_bound():
    # NOTE: 1 MiB holds one or two of these matrices per batch: many batches of each shape.
    shapes = [(64, 96)] * 9 + [(96, 64)] * 7 + [(3, 40, 72)]
    whole = run_path({}, shapes)
    split = run_path({"DMUON_NS_BATCH_MB": "1"}, shapes)
    for df, ds in zip(whole["deltas"], split["deltas"]):
        for a, b in zip(df, ds):
            assert rel(a, b) <= 2e-2
    assert whole["orthogonalized"] == split["orthogonalized"] == 9 + 7 + 3  # matrices
    # The batches the stats list (matrices, rows, cols): every matrix once, in more batches
    # under the small bound, none of them larger than the unbounded step's.
    for run in (whole, split):
        assert sum(count for count, _, _ in run["batches"]) == 9 + 7 + 3
        assert {(r, c) for _, r, c in run["batches"]} <= {(64, 96), (96, 64), (40, 72)}
    assert len(split["batches"]) > len(whole["batches"])
    assert max(count for count, _, _ in split["batches"]) <= max(count for count, _, _ in whole["batches"])


@needs_gpu
def test_fused_step_is_deterministic():
    def run() -> list[torch.Tensor]:
        torch.manual_seed(1)
        params = [torch.nn.Parameter(torch.randn(*s, device="cuda")) for s in SHAPES]
        opt = dmuon.DMuon(params, lr=0.02, weight_decay=0.01)
        for _ in range(2):
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()
        return [p.detach().clone() for p in params] + [opt.state[p]["momentum_buffer"].clone() for p in params]

    first, second = run(), run()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@needs_gpu
def test_fused_and_other_parameters_in_one_step():
    # fp64 and bf16 parameters cannot take the fused path; they share the step with fp32 ones.
    # Bound (as test_gpu_optimizer.py): ‖d − d_exact‖ ≤ 3·‖d_half − d_exact‖ + 1e-3·‖d_exact‖
    # per step, d_half from the reference iterating in fp16; a bf16 parameter (and its bf16
    # momentum) also rounds the parameter itself: 10% of the step there.
    torch.manual_seed(2)
    initial = [torch.randn(64, 96, dtype=torch.float64) / 10, torch.randn(64, 96, dtype=torch.float64) / 10,
               torch.randn(48, 80, dtype=torch.float64) / 100, torch.randn(96, 64, dtype=torch.float64) / 10]
    dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.float32]
    params = [torch.nn.Parameter(x.to(dt).cuda()) for x, dt in zip(initial, dtypes)]
    exact_p = [torch.nn.Parameter(x.clone()) for x in initial]
    half_p = [torch.nn.Parameter(x.clone()) for x in initial]
    opt = dmuon.DMuon(params, lr=0.02, weight_decay=0.0)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    exact = ReferenceDMuon([dict(group, params=exact_p)])
    half = ReferenceDMuon([dict(group, params=half_p)], ns_dtype=torch.float16)
    for _ in range(2):
        before = [[p.detach().double().cpu().clone() for p in ps] for ps in (params, exact_p, half_p)]
        for p, e, h in zip(params, exact_p, half_p):
            g = torch.randn(p.shape, dtype=torch.float64)
            p.grad, e.grad, h.grad = g.to(p.dtype).cuda(), g.clone(), g.clone()
        opt.step()
        exact.step()
        half.step()
        for i, dt in enumerate(dtypes):
            d, d_exact, d_half = (ps[i].detach().double().cpu() - b[i] for ps, b in zip((params, exact_p, half_p), before))
            bound = 3 * (d_half - d_exact).norm() + 1e-3 * d_exact.norm()
            if dt == torch.bfloat16:
                bound = 0.1 * d_exact.norm()
            assert (d - d_exact).norm() <= bound, (dt, float((d - d_exact).norm() / d_exact.norm()))


def step_refused(opt, policy: str) -> None:
    """One step over a non-finite gradient: it raises under nonfinite="raise" and counts one
    skipped step under "skip"."""
    if policy == "raise":
        with pytest.raises(dmuon.NonFiniteGradientError, match="non-finite gradient"):
            opt.step()
    else:
        opt.step()
        assert opt.param_groups[0]["num_skipped_steps"] == 1


# ---------------------------------------------------------------- the device-side gate
# One process checks every gradient (AdamW's too) and every momentum buffer in its own first
# pass and runs the update behind a device-side gate, with one host wait at the end of the
# step (the step engine, one process): a NaN must leave parameters and momentum buffers
# bitwise untouched, as a distributed step does.

def gated_model(seed: int, nonfinite: str = "raise"):
    """Matrices (wide, tall) and an AdamW vector, after one first step."""
    torch.manual_seed(seed)
    mats = [torch.nn.Parameter(torch.randn(64, 96, device="cuda")), torch.nn.Parameter(torch.randn(96, 64, device="cuda"))]
    vec = torch.nn.Parameter(torch.randn(32, device="cuda"))
    opt = dmuon.DMuon([dict(params=mats), dict(params=[vec], use_muon=False)], lr=0.02, weight_decay=0.1,
                      nonfinite=nonfinite)
    for p in (*mats, vec):
        p.grad = torch.randn_like(p)
    opt.step()
    return mats, vec, opt


@needs_gpu
@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("where", ["fused gradient", "adamw gradient", "momentum buffer"])
def test_the_device_gate_changes_nothing_when_anything_is_bad(policy, where):
    mats, vec, opt = gated_model(7, policy)
    state = lambda: [t.detach().clone() for t in (*mats, vec, *(opt.state[p]["momentum_buffer"] for p in mats),  # noqa: E731
                                                  opt.state[vec]["exp_avg"])]
    for p in (*mats, vec):
        p.grad = torch.randn_like(p)
    if where == "fused gradient":
        mats[1].grad[3, 5] = float("inf")
    elif where == "adamw gradient":
        vec.grad[4] = float("nan")
    else:
        opt.state[mats[0]]["momentum_buffer"][2, 2] = float("nan")
    before = state()
    if where == "momentum buffer":
        with pytest.raises(dmuon.NonFiniteGradientError, match="momentum buffer"):
            opt.step()
    else:
        step_refused(opt, policy)
    assert type(opt.runtime).__name__ == "EngineRuntime"
    for a, b in zip(state(), before):
        assert torch.equal(a.nan_to_num(nan=7.0), b.nan_to_num(nan=7.0))  # NOTE: the planted NaN equals itself
    # The next clean step goes through (a corrupt buffer stays corrupt: the user must reset it).
    if where != "momentum buffer":
        for p in (*mats, vec):
            p.grad = torch.randn_like(p)
        opt.step()
        assert opt.runtime.last_stats.num_fused == 2
        assert all(not torch.equal(p.detach(), b) for p, b in zip((*mats, vec), before))


@needs_gpu
def test_the_device_gate_reports_a_non_finite_result_beside_adamw_and_applies_none_of_it():
    # NOTE: an NS polynomial that only scales (a = 1e4, b = c = 0) overflows fp16 within three
    # steps: the result is Inf everywhere although the gradients are finite (no decay).
    mats, vec, opt = gated_model(8)
    opt.param_groups[0]["weight_decay"] = 0.0
    opt.param_groups[0]["ns_coefficients"] = [(1e4, 0.0, 0.0)] * 5
    for p in (*mats, vec):
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in mats]
    with pytest.raises(RuntimeError, match="not finite"):
        opt.step()
    for p, b in zip(mats, before):
        assert torch.equal(p.detach(), b)
