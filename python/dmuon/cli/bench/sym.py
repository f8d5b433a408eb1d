"""`python -m dmuon bench sym`: the symmetric products of Gram Newton–Schulz by path, and the
one-GPU optimizer step with each path forced, in one process.

For every distinct symmetric product of a model's Gram NS step (dmuon.analysis.step_products:
X·Xᵀ and the β·C products in the Gram space), timed in turns on the same operands: cuBLAS's
dense product (torch.bmm / baddbmm, the whole m×m result), dmuon's dense path ("lt:0":
cuBLASLt, then the mirror), the portable row-panel product ("tri:<block>", every candidate
block, the fastest reported) and, where the GPU runs it, the sm_90a kernel (every built
configuration, the fastest reported). The ratio to cuBLAS's dense product on the same GPU is
what carries over to other GPUs. Then dmuon.DMuon.step over the model's Muon matrices with
DMUON_SYM_PATH forced to each path (tuned in the warm-up steps), the first path again last.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import torch

from dmuon.cli.bench.timing import cuda_time_ms, interleaved_ms

# NOTE: Pi0 (openpi's gemma.py configurations): the PaliGemma backbone is Gemma 2B (width 2048,
# MLP 16384, 18 layers, 8 query heads and 1 KV head of 256), the action expert Gemma 300M
# (width 1024, MLP 4096, 18 layers, the same heads). (batch, rows, cols) per projection:
# q, k, v, o, gate, up, down of each layer, stacked over the 18 layers.
_PI0_SHAPES = [(18, 2048, 2048), (18, 256, 2048), (18, 256, 2048), (18, 2048, 2048), (18, 16384, 2048),
               (18, 16384, 2048), (18, 2048, 16384),
               (18, 2048, 1024), (18, 256, 1024), (18, 256, 1024), (18, 1024, 2048), (18, 4096, 1024),
               (18, 4096, 1024), (18, 1024, 4096)]

PATHS = ("dense", "portable", "sm90")


def model_matrices(name: str) -> list[tuple[int, int, int]]:
    """(batch, rows, cols) of every Muon matrix of a model manifest, or of Pi0 ("pi0")."""
    if name.lower() == "pi0":
        return list(_PI0_SHAPES)
    from dmuon.cli.bench.ns import model_shapes

    return model_shapes(name)


def gram_products(shapes) -> list[dict]:
    """The distinct symmetric products of the Gram NS step over same-shape batches."""
    from dmuon import analysis

    batches: dict = OrderedDict()
    for b, r, c in shapes:
        batches[(r, c)] = batches.get((r, c), 0) + b
    products = analysis.step_products([(n, r, c) for (r, c), n in batches.items()], "gram", 5)
    return [p for p in products if p["kind"] == "symmetric"]


def _padded(batch: int, rows: int, cols: int, dtype) -> torch.Tensor:
    """A [batch, rows, cols] view with rows padded to 8 elements, as the backend lays them out."""
    ld = (cols + 7) // 8 * 8
    return torch.zeros(batch, rows, ld, device="cuda", dtype=dtype)[..., :cols]


def time_product(p: dict, iters: int, kernel_configs: list[str]) -> dict:
    """{"cublas", "lt:0", best portable (name, ms), best sm90 (name, ms)} of one product."""
    testing_ops = torch.ops.dmuon_testing
    b, m, k = p["batch"], p["m"], p["k"]
    dtype = torch.float16
    a = _padded(b, m, k, dtype)
    a.copy_(torch.randn(b, m, k, device="cuda") / math.sqrt(k))
    rhs = a
    if not p["same_operands"]:
        rhs = _padded(b, m, k, dtype)
        rhs.copy_(torch.randn(b, m, k, device="cuda") / math.sqrt(k))
    c = None
    if p["with_c"]:
        c = _padded(b, m, m, dtype)
        c.copy_(torch.randn(b, m, m, device="cuda"))
    alpha, beta = (1.0, 0.5) if c is not None else (1.0, 0.0)

    def cublas():
        rt = rhs.transpose(1, 2)
        return torch.bmm(a, rt) if c is None else torch.baddbmm(c, a, rt, beta=beta, alpha=alpha)

    def named(config):
        # NOTE: unpoisoned output: the call holds the product alone, as torch's does.
        return lambda: testing_ops.cuda_sym_product_config(a, rhs, c, alpha, beta, config, poison=False)

    portable = list(testing_ops.cuda_sym_portable_configs(m))
    fns = {"cublas": cublas, "lt:0": named("lt:0"), **{n: named(n) for n in portable + kernel_configs}}
    timed = interleaved_ms(fns, iters, rounds=3)
    out = {"cublas": timed["cublas"], "lt:0": timed["lt:0"]}
    best = min(portable, key=timed.get)
    out["portable"] = (best, timed[best])
    if kernel_configs:
        best = min(kernel_configs, key=timed.get)
        out["sm90"] = (best, timed[best])
    del a, rhs, c
    return out


def product_table(model: str, shapes, iters: int, kernel_configs: list[str]) -> None:
    products = gram_products(shapes)
    print(f"\nmodel {model}: {len(products)} distinct symmetric products of the Gram NS step (fp16); "
          f"ms, in turns; x: time / cuBLAS dense", flush=True)
    print(f"{'batch x m x k':>22s} {'β·C':>4s} {'cuBLAS':>8s} {'lt:0+mirror':>12s} {'portable':>22s} "
          f"{'sm90':>30s}")
    totals = {"cublas": 0.0, "lt:0": 0.0, "portable": 0.0, "sm90": 0.0}
    for p in products:
        t = time_product(p, iters, kernel_configs)
        totals["cublas"] += t["cublas"]
        totals["lt:0"] += t["lt:0"]
        totals["portable"] += t["portable"][1]
        name, ms = t["portable"]
        portable = f"{ms:.3f} {ms / t['cublas']:.2f}x {name}"
        sm90 = "-"
        if "sm90" in t:
            totals["sm90"] += t["sm90"][1]
            s_name, s_ms = t["sm90"]
            sm90 = f"{s_ms:.3f} {s_ms / t['cublas']:.2f}x {s_name.split(':', 1)[1]}"
        shape = f"{p['batch']}x{p['m']}x{p['k']}"
        print(f"{shape:>22s} {'yes' if p['with_c'] else 'no':>4s} {t['cublas']:8.3f} {t['lt:0']:12.3f} "
              f"{portable:>22s} {sm90:>30s}", flush=True)
        torch.cuda.empty_cache()
    line = (f"  sum over the distinct products: cuBLAS {totals['cublas']:.2f} ms, lt:0+mirror {totals['lt:0']:.2f}, "
            f"portable {totals['portable']:.2f} ({totals['portable'] / totals['cublas']:.2f}x)")
    if kernel_configs:
        line += f", sm90 {totals['sm90']:.2f} ({totals['sm90'] / totals['cublas']:.2f}x)"
    print(line, flush=True)


def step_table(model: str, shapes, paths, iters: int, warmup: int) -> None:
    """dmuon.DMuon.step with DMUON_SYM_PATH forced to each path, one optimizer at a time (each
    holds its own state and graph workspaces), the first path timed again last."""
    import gc

    import dmuon

    params = [torch.randn(*((b,) if b > 1 else ()), r, c, device="cuda") * 0.02 for b, r, c in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    print(f"\nmodel {model}: dmuon.DMuon.step ({len(params)} Muon tensors), median ms; x: time / the first path")
    saved = os.environ.get("DMUON_SYM_PATH")
    first = None
    try:
        for path in list(paths) + [paths[0]]:
            # NOTE: the knob is read when the step's CUDA ops are made (the optimizer's first step).
            os.environ["DMUON_SYM_PATH"] = path
            opt = dmuon.DMuon(params, lr=0.02, weight_decay=0.0, execution=dmuon.Execution(cost_model="analytic"))
            # NOTE: the first steps tune every product of this path and capture the graphs.
            ms = cuda_time_ms(opt.step, max(warmup, 4), iters)
            first = ms if first is None else first
            print(f"  DMUON_SYM_PATH={path:10s} {ms:9.2f} ms {ms / first:6.2f}x", flush=True)
            del opt
            gc.collect()
            torch.cuda.empty_cache()
    finally:
        if saved is None:
            os.environ.pop("DMUON_SYM_PATH", None)
        else:
            os.environ["DMUON_SYM_PATH"] = saved
    del params
    torch.cuda.empty_cache()


def run(args) -> None:
    from dmuon.cli.bench.ns import environment
    from dmuon.cli.usage import input_checks

    with input_checks():
        for model in args.model + args.step_model:
            model_matrices(model)
    if not torch.cuda.is_available():
        raise SystemExit("bench sym needs a CUDA GPU")
    testing_ops = torch.ops.dmuon_testing
    if not hasattr(testing_ops, "cuda_sym_portable_configs"):
        raise SystemExit("bench sym needs a build with the CUDA backend")
    torch.manual_seed(0)
    print(environment())
    kernel_ok = bool(testing_ops.cuda_sym_kernel_usable(torch.zeros(1, device="cuda"), "float16"))
    kernel_configs = list(testing_ops.cuda_sym_configs()) if kernel_ok else []
    print(f"sm_90a kernel usable here: {kernel_ok}", flush=True)
    for model in args.model:
        product_table(model, model_matrices(model), args.iters, kernel_configs)
    paths = [p for p in PATHS if p != "sm90" or kernel_ok]
    for model in args.step_model:
        step_table(model, model_matrices(model), paths, args.iters, args.warmup)


def register(subparsers) -> None:
    parser = subparsers.add_parser("sym", help="symmetric products by path (portable, dense, sm_90a) and the "
                                               "one-GPU step with each path forced")
    parser.add_argument("--model", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "pi0"],
                        help="models whose Gram products are timed (manifest names or pi0)")
    parser.add_argument("--step-model", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-1.5b", "pi0"],
                        help="models whose whole DMuon.step is timed with each path forced")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions a round (median reported)")
    parser.add_argument("--warmup", type=int, default=4)
    parser.set_defaults(func=run)
