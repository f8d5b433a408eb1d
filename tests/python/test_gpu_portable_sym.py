"""The portable symmetric products ("blk:<block>": the lower blocks in one pointer-array GEMM, and
"tri:<block>": row panels of the lower triangle, both through cuBLASLt, then the mirror) on a
GPU, on any GPU and forced on sm_90: every dtype, batch and odd size against fp64, poisoned
outputs and padding, the C entries they must not read; and the DMUON_SYM_PATH knob forcing each
path of the step's products."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dmuon._ops import testing_ops
from ns_helpers import reference, rel
from test_gpu_autotune import assert_like_dense, chosen, gram_problem, is_sm90, needs_backend, needs_kernel

pytestmark = pytest.mark.gpu

# NOTE: (m, k) of odd sizes: m below one block, a remainder of one row (4097), k not a multiple
# of 8; 3×5000 has one short panel (no whole block) whatever the block.
PORTABLE_SHAPES = [(1, 127, 1001), (3, 127, 1001), (1, 3, 5000), (2, 300, 200), (1, 4097, 4095), (5, 640, 72)]
BLOCKS = [128, 256, 384, 1024, 4096]
CONFIGS = [f"{family}:{block}" for family in ("blk", "tri") for block in BLOCKS]


def upper_outside_diagonal_blocks(m: int, block: int, device="cuda") -> torch.Tensor:
    """True above the diagonal except inside the diagonal blocks (block × block; the last one
    holds the remaining rows): the C entries the portable products must never read."""
    r = torch.arange(m, device=device)
    return (r[:, None] < r[None, :]) & (r[:, None] // block != r[None, :] // block)


@needs_backend
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", PORTABLE_SHAPES)
@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("operands", ["same", "distinct", "strided"])
def test_portable_product_matches_fp64(dtype, shape, with_c, operands):
    a, b, c, alpha, beta, exact, same = gram_problem(dtype, shape, with_c, operands=operands)
    for config in CONFIGS:
        block = int(config.split(":")[1])
        c_read = c
        if c is not None:
            # The C entries outside what the panels cover are NaN: they must not be read. (A copy
            # with C's padded layout: the padding stays NaN too.)
            c_read = torch.full((c.shape[0], c.shape[1], c.stride(1)), float("nan"), dtype=c.dtype,
                                device=c.device)[..., : c.shape[2]]
            c_read.copy_(c)
            c_read.masked_fill_(upper_outside_diagonal_blocks(shape[1], block), float("nan"))
        # NOTE: D is NaN-poisoned by the op (every element must be written); A's, B's and C's
        # row padding is NaN (gram_problem's padded()).
        d = testing_ops.cuda_sym_product_config(a, b, c_read, alpha, beta, config)
        assert_like_dense(d, config, exact, same)


@needs_backend
def test_portable_names_that_do_not_run_are_clear_errors():
    a = torch.randn(1, 64, 64, device="cuda", dtype=torch.float16)
    for name in ["tri:100", "tri:0", "tri:", "blk:100", "blk:0", "blk:"]:
        with pytest.raises(Exception, match="symmetric-product configuration"):
            testing_ops.cuda_sym_product_config(a, a, None, 1.0, 0.0, name)


_STEP_SCRIPT = """
import sys, torch
from dmuon import _C
from dmuon._ops import testing_ops
c, r = _C.default_schedule("gram", 5)
flat = [v for t in c for v in t]
torch.manual_seed(1)
x = torch.randn(2, 520, 1300, device="cuda")
out = testing_ops.orthogonalize(x, "gram", flat, list(r), 1e-7, sys.argv[2], "float16")
torch.save((x.cpu(), out.cpu()), sys.argv[1])
"""


def run_forced(tmp_path, path: str, backend: str = "cuda") -> subprocess.CompletedProcess:
    env = dict(os.environ, DMUON_AUTOTUNE_CACHE="none", DMUON_PRINT_CONFIGS="1", DMUON_SYM_PATH=path)
    env.pop("DMUON_AUTOTUNE", None)
    return subprocess.run([sys.executable, "-c", _STEP_SCRIPT, str(tmp_path / f"{path}.pt"), backend],
                          capture_output=True, text=True, timeout=300, env=env)


@needs_backend
@pytest.mark.parametrize("path,prefix,log", [("portable", ("blk:", "tri:"), "portable lower blocks or row panels only"),
                                             ("blocks", ("blk:",), "portable lower blocks only"),
                                             ("panels", ("tri:",), "portable row panels only"),
                                             ("dense", ("lt:",), "dense cuBLASLt, mirrored"),
                                             ("sm90", ("sm90:",), "the sm_90a kernel only")])
def test_dmuon_sym_path_forces_every_product_of_the_step(tmp_path, path, prefix, log):
    if path == "sm90" and not is_sm90():
        bad = run_forced(tmp_path, path)
        assert bad.returncode != 0 and "DMUON_SYM_PATH=sm90" in bad.stderr, bad.stderr[-2000:]
        return
    if path == "sm90" and not testing_ops.cuda_sym_configs():
        pytest.skip("this build has no sm_90a kernel")
    run = run_forced(tmp_path, path)
    assert run.returncode == 0, run.stderr[-3000:]
    picks = chosen(run.stderr, "sym")
    assert picks and all(p.startswith(prefix) for p in picks), picks
    # One line names the path chosen for the GPU.
    lines = [line for line in run.stderr.splitlines() if line.startswith("dmuon: symmetric products (float16)")]
    assert len(lines) == 1 and log in lines[0], lines
    x, out = torch.load(tmp_path / f"{path}.pt")
    expected = reference(x, "gram")
    baseline = rel(reference(x, "gram", torch.float16), expected)
    assert rel(out, expected) <= 3.0 * baseline + 1e-3, (path, rel(out, expected), baseline)


@needs_backend
def test_an_unknown_dmuon_sym_path_is_refused_by_name(tmp_path):
    run = run_forced(tmp_path, "triangle")
    assert run.returncode != 0
    assert "DMUON_SYM_PATH=triangle: expected auto, sm90, portable, blocks, panels or dense" in run.stderr, run.stderr[-2000:]


@needs_kernel
def test_the_tuner_chooses_among_every_path_on_sm90(tmp_path):
    # auto on sm_90: the kernel's configurations, the portable products and cuBLASLt are all
    # candidates of the 520×520 products (k = 1300 and 520), and every one is checked.
    run = run_forced(tmp_path, "auto")
    assert run.returncode == 0, run.stderr[-3000:]
    picks = chosen(run.stderr, "sym")
    assert picks and all(p.split(":")[0] in ("sm90", "blk", "tri", "lt") for p in picks), picks
    assert "the sm_90a kernel, portable lower blocks or row panels, or dense cuBLASLt" in run.stderr
