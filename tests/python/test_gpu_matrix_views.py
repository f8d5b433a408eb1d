"""Matrix views on one CUDA GPU (marker gpu; skipped without a GPU): transposed HF Conv1D
weights and MultiheadAttention's q, k, v row blocks through the fused single-GPU step (its
transposed batches use (cols, rows) for the lr adjustment), row blocks of different rows as
items of their own rows (the engine's ItemTable), against the float64 reference within half
precision (the bound of gpu_reference.compare_with_reference)."""

from __future__ import annotations

import pytest
import torch

import dmuon
from gpu_reference import compare_with_reference

pytestmark = pytest.mark.gpu

SHAPES = {"attn.c_attn.weight": (32, 96), "mlp.c_fc.weight": (32, 128), "attn.in_proj_weight": (96, 32),
          "attn.fused_gqa": (64, 32), "mlp.down.weight": (32, 128)}


@pytest.mark.parametrize("algorithm", ["gram", "standard"])
def test_transposed_and_row_block_views_match_the_reference_on_gpu(algorithm):
    views = {"attn.c_attn.weight": dmuon.MatrixView(transposed=True), "mlp.c_fc.weight": dmuon.MatrixView(transposed=True),
             "attn.in_proj_weight": dmuon.MatrixView(row_blocks=(32, 32, 32)),
             "attn.fused_gqa": dmuon.MatrixView(row_blocks=(32, 16, 16)), "mlp.down.weight": dmuon.MatrixView()}
    opt, _, _, _ = compare_with_reference(SHAPES, ns_dtype=torch.float16 if algorithm == "gram" else torch.bfloat16,
                                          views=views, lr=0.02, weight_decay=0.1, ns_algorithm=algorithm,
                                          adjust_lr="original")
    assert type(opt.runtime).__name__ == "EngineRuntime", "one GPU steps through the step engine"
