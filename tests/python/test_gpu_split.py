"""Split orthogonalization on one CUDA GPU (marker gpu; skipped without a GPU): each option
(split_rows for a fused GQA q, k, v and a fused gate/up; split_heads by rows, and by columns
with split_dim=1 as for o_proj) through the engine's
CUDA step, against the float64 plain-loop reference within the distance of a half-precision
reference (the bound of test_gpu_matrix_views.py)."""

from __future__ import annotations

import pytest
import torch

import dmuon
from dmuon.reference import ReferenceDMuon

pytestmark = pytest.mark.gpu

# (shape, group options) per case: q, k, v = 64 + 32 + 32 rows; gate/up 2 × 96; 8 heads of 16
# rows; o_proj [64, 128] as 8 heads of 16 columns (64x16 blocks).
CASES = {"split_qkv": ((128, 64), {"split_rows": [64, 32, 32]}),
         "split_gate_up": ((192, 64), {"split_rows": [96, 96]}),
         "split_heads": ((128, 64), {"split_heads": 8}),
         "split_heads_cols": ((64, 128), {"split_heads": 8, "split_dim": 1})}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("algorithm", ["gram", "standard"])
def test_split_group_matches_the_reference_on_gpu(case, algorithm):
    shape, options = CASES[case]
    gen = torch.Generator().manual_seed(0)
    initial = [torch.randn(*shape, generator=gen, dtype=torch.float64) / shape[1] ** 0.5 for _ in range(2)]
    gpu = [torch.nn.Parameter(t.float().cuda()) for t in initial]
    opt = dmuon.DMuon([{"params": [(f"layers.{k}.w", p) for k, p in enumerate(gpu)], "use_muon": True, **options}],
                      lr=0.02, weight_decay=0.1, ns_algorithm=algorithm, adjust_lr="match_rms_adamw")
    view = opt.matrix_view(gpu[0])
    assert len(opt.runtime.item_params) == 2 * (view.col_blocks or len(view.row_blocks))
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    refs = []
    for dtype in (torch.float64, torch.float16 if algorithm == "gram" else torch.bfloat16):
        params = [torch.nn.Parameter(t.clone()) for t in initial]
        refs.append((params, ReferenceDMuon([dict(group, params=params)], ns_dtype=dtype)))
    (exact_p, exact), (half_p, half) = refs
    for step in range(3):
        before = [[ps[k].detach().double().cpu().clone() for ps in (gpu, exact_p, half_p)] for k in range(2)]
        for k in range(2):
            grad = torch.randn(shape, generator=gen, dtype=torch.float64)
            exact_p[k].grad, half_p[k].grad, gpu[k].grad = grad.clone(), grad.clone(), grad.float().cuda()
        opt.step()
        exact.step()
        half.step()
        for k in range(2):
            d_gpu, d_exact, d_half = (ps[k].detach().double().cpu() - b for ps, b in zip((gpu, exact_p, half_p),
                                                                                          before[k]))
            bound = 3 * (d_half - d_exact).norm() + 1e-3 * d_exact.norm()
            assert (d_gpu - d_exact).norm() <= bound, (case, algorithm, step, k)
