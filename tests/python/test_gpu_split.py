"""Split orthogonalization on one CUDA GPU (marker gpu; skipped without a GPU): each option
(split_rows for a fused GQA q, k, v and a fused gate/up; split_heads by rows, and by columns
with split_dim=1 as for o_proj) through the engine's
CUDA step, against the float64 plain-loop reference within the distance of a half-precision
reference (the bound of gpu_reference.compare_with_reference)."""

from __future__ import annotations

import pytest
import torch

from gpu_reference import compare_with_reference

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
    opt, gpu, _, _ = compare_with_reference({f"layers.{k}.w": shape for k in range(2)},
                                            ns_dtype=torch.float16 if algorithm == "gram" else torch.bfloat16,
                                            group=options, lr=0.02, weight_decay=0.1, ns_algorithm=algorithm,
                                            adjust_lr="match_rms_adamw")
    view = opt.matrix_view(gpu[0])
    assert len(opt.runtime.item_params) == 2 * (view.col_blocks or len(view.row_blocks))
