"""Matrix views on one CUDA GPU (marker gpu; skipped without a GPU): transposed HF Conv1D
weights and MultiheadAttention's q, k, v row blocks through the fused single-GPU step (its
transposed batches use (cols, rows) for the lr adjustment), row blocks of different rows as
items of their own rows (the engine's ItemTable), against the float64 reference within half
precision (the bound of test_gpu_optimizer.py)."""

from __future__ import annotations

import pytest
import torch

import dmuon
from dmuon.reference import ReferenceDMuon

pytestmark = pytest.mark.gpu

SHAPES = {"attn.c_attn.weight": (32, 96), "mlp.c_fc.weight": (32, 128), "attn.in_proj_weight": (96, 32),
          "attn.fused_gqa": (64, 32), "mlp.down.weight": (32, 128)}


@pytest.mark.parametrize("algorithm", ["gram", "standard"])
def test_transposed_and_row_block_views_match_the_reference_on_gpu(algorithm):
    gen = torch.Generator().manual_seed(0)
    initial = {n: torch.randn(*s, generator=gen, dtype=torch.float64) / s[-1] ** 0.5 for n, s in SHAPES.items()}
    gpu = {n: torch.nn.Parameter(t.float().cuda()) for n, t in initial.items()}
    views = {"attn.c_attn.weight": dmuon.MatrixView(transposed=True), "mlp.c_fc.weight": dmuon.MatrixView(transposed=True),
             "attn.in_proj_weight": dmuon.MatrixView(row_blocks=(32, 32, 32)),
             "attn.fused_gqa": dmuon.MatrixView(row_blocks=(32, 16, 16)), "mlp.down.weight": dmuon.MatrixView()}
    opt = dmuon.DMuon([{"params": list(gpu.items()), "use_muon": True}], lr=0.02, weight_decay=0.1,
                      ns_algorithm=algorithm, adjust_lr="original")
    for n, p in gpu.items():
        opt._params.set_view(p, views[n])  # NOTE: the views routing gives Conv1D and MHA, set directly
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    refs = []
    for dtype in (torch.float64, torch.float16 if algorithm == "gram" else torch.bfloat16):
        params = {n: torch.nn.Parameter(t.clone()) for n, t in initial.items()}
        refs.append((params, ReferenceDMuon([dict(group, params=list(params.values()),
                                                  row_blocks=[views[n].row_blocks for n in params],
                                                  transposed=[views[n].transposed for n in params])],
                                            ns_dtype=dtype)))
    (exact_p, exact), (half_p, half) = refs
    for step in range(3):  # NOTE: step 1 creates the momentum buffers, 2 and 3 reuse them
        before = {n: [ps[n].detach().double().cpu().clone() for ps in (gpu, exact_p, half_p)] for n in SHAPES}
        for n in SHAPES:
            grad = torch.randn(SHAPES[n], generator=gen, dtype=torch.float64)
            exact_p[n].grad, half_p[n].grad, gpu[n].grad = grad.clone(), grad.clone(), grad.float().cuda()
        opt.step()
        exact.step()
        half.step()
        for n in SHAPES:
            d_gpu, d_exact, d_half = (ps[n].detach().double().cpu() - b for ps, b in zip((gpu, exact_p, half_p),
                                                                                          before[n]))
            bound = 3 * (d_half - d_exact).norm() + 1e-3 * d_exact.norm()
            assert (d_gpu - d_exact).norm() <= bound, (algorithm, step, n)
    assert type(opt.runtime).__name__ == "EngineRuntime", "one GPU steps through the step engine"
