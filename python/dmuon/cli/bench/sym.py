"""`python -m dmuon bench sym`: the symmetric products of Gram Newton–Schulz by path, and the
one-GPU optimizer step with each path forced, in one process.

For every distinct symmetric product of a model's Gram NS step (dmuon.analysis.step_products:
X·Xᵀ and the β·C products in the Gram space), timed in turns on the same operands: cuBLAS's
dense product (torch.bmm / baddbmm, the whole m×m result), dmuon's dense path ("lt:0":
cuBLASLt, then the mirror), the portable products — lower blocks in one pointer-array GEMM
("blk:<block>") and row panels ("tri:<block>"), every candidate block, the fastest of each
reported — and, where the GPU runs it, the sm_90a kernel (every built configuration, the fastest
reported). The ratio to cuBLAS's dense product on the same GPU is what carries over to other
GPUs. Then dmuon.DMuon.step over the model's Muon matrices with DMUON_SYM_PATH forced to each
path (tuned in the warm-up steps), the first path again last.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import torch

from dmuon.cli.bench.local_ns import model_shapes
from dmuon.cli.bench.timing import cuda_time_ms, interleaved_ms

# NOTE: Pi0 (openpi's gemma.py configurations): the PaliGemma backbone is Gemma 2B (width 2048,
# MLP 16384, 18 layers, 8 query heads and 1 KV head of 256), the action expert Gemma 300M
# (width 1024, MLP 4096, 18 layers, the same heads). (batch, rows, cols) per projection:
# q, k, v, o, gate, up, down of each layer, stacked over the 18 layers.
_PI0_SHAPES = [(18, 2048, 2048), (18, 256, 2048), (18, 256, 2048), (18, 2048, 2048), (18, 16384, 2048),
               (18, 16384, 2048), (18, 2048, 16384),
               (18, 2048, 1024), (18, 256, 1024), (18, 256, 1024), (18, 1024, 2048), (18, 4096, 1024),
               (18, 4096, 1024), (18, 1024, 4096)]

PATHS = ("dense", "blocks", "panels", "sm90")
# The portable families of bench sym's columns: configuration prefix → column.
FAMILIES = {"blk": "blocks", "tri": "panels"}


def model_matrices(name: str) -> list[tuple[int, int, int]]:
    """(batch, rows, cols) of every Muon matrix of a model manifest, or of Pi0 ("pi0")."""
    if name.lower() == "pi0":
        return list(_PI0_SHAPES)
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


def product_fns(p: dict, configs: list[str]) -> tuple[dict, list[str]]:
    """Callables of one product (a dict of dmuon.analysis.step_products) on fp16 operands laid
    out as the backend lays them: "cublas", cuBLAS's dense product (torch.bmm / baddbmm, the
    whole m×m result), then each configuration of `configs` through the test op; one that
    fails its first run is left out and named in the list returned beside them."""
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

    fns, failed = {"cublas": cublas}, []
    for name in configs:
        try:
            named(name)()
            fns[name] = named(name)
        except RuntimeError as error:  # NOTE: e.g. cuBLASLt offers no pointer-array algorithm here
            failed.append(f"{name}: {str(error).splitlines()[0]}")
    return fns, failed


def time_product(p: dict, iters: int, kernel_configs: list[str]) -> dict:
    """{"cublas", "lt:0", best of each portable family and of sm90 (name, ms)} of one product,
    timed in turns; a configuration that fails its first run is named in "failed"."""
    portable = list(torch.ops.dmuon_testing.cuda_sym_portable_configs(p["m"]))
    fns, failed = product_fns(p, ["lt:0", *portable, *kernel_configs])
    timed = interleaved_ms(fns, iters, rounds=3)
    out = {"cublas": timed["cublas"], "lt:0": timed["lt:0"], "failed": failed}
    groups = {column: [n for n in timed if n.split(":")[0] == prefix] for prefix, column in FAMILIES.items()}
    groups["sm90"] = [n for n in timed if n in kernel_configs]
    for column, names in groups.items():
        if names:
            best = min(names, key=timed.get)
            out[column] = (best, timed[best])
    del fns
    return out


def product_table(model: str, shapes, iters: int, kernel_configs: list[str]) -> None:
    products = gram_products(shapes)
    print(f"\nmodel {model}: {len(products)} distinct symmetric products of the Gram NS step (fp16); "
          f"ms, in turns; x: time / cuBLAS dense", flush=True)
    columns = ["blocks", "panels", "portable"] + (["sm90"] if kernel_configs else [])
    print(f"{'batch x m x k':>22s} {'β·C':>4s} {'cuBLAS':>8s} {'lt:0+mirror':>12s} "
          + " ".join(f"{c:>24s}" for c in columns))
    totals = {"cublas": 0.0, "lt:0": 0.0, **{c: 0.0 for c in columns}}
    missing = set()  # columns without a time for some product: no sum
    for p in products:
        t = time_product(p, iters, kernel_configs)
        # The portable path: the faster of the two families.
        t["portable"] = min((t[c] for c in ("blocks", "panels") if c in t), key=lambda x: x[1], default=None)
        totals["cublas"] += t["cublas"]
        totals["lt:0"] += t["lt:0"]
        cells = []
        for column in columns:
            if t.get(column) is None:
                missing.add(column)
                cells.append(f"{'-':>24s}")
                continue
            name, ms = t[column]
            totals[column] += ms
            label = name.split(":", 1)[1] if column == "sm90" else name
            cell = f"{ms:.3f} {ms / t['cublas']:.2f}x {label}"
            cells.append(f"{cell:>24s}")
        shape = f"{p['batch']}x{p['m']}x{p['k']}"
        print(f"{shape:>22s} {'yes' if p['with_c'] else 'no':>4s} {t['cublas']:8.3f} {t['lt:0']:12.3f} "
              + " ".join(cells), flush=True)
        for failure in t["failed"]:
            print(f"{'':>22s} failed: {failure}", flush=True)
        torch.cuda.empty_cache()
    line = f"  sum over the distinct products: cuBLAS {totals['cublas']:.2f} ms, lt:0+mirror {totals['lt:0']:.2f}"
    for column in columns:
        if column not in missing:
            line += f", {column} {totals[column]:.2f} ({totals[column] / totals['cublas']:.2f}x)"
    print(line, flush=True)


def step_table(model: str, shapes, paths, iters: int, warmup: int) -> None:
    """dmuon.DMuon.step with DMUON_SYM_PATH forced to each path, one optimizer at a time (each
    holds its own state and graph workspaces), the first path timed again last."""
    import gc

    from dmuon.cli.bench.local_ns import local_dmuon, model_params

    params = model_params(shapes)
    print(f"\nmodel {model}: dmuon.DMuon.step ({len(params)} Muon tensors), median ms; x: time / the first path")
    saved = os.environ.get("DMUON_SYM_PATH")
    first = None
    try:
        for path in list(paths) + [paths[0]]:
            # NOTE: the knob is read when the step's CUDA ops are made (the optimizer's first step).
            os.environ["DMUON_SYM_PATH"] = path
            opt = local_dmuon(params)
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
    from dmuon.cli.bench.environment import environment_line
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
    print(environment_line("cuda"))
    kernel_ok = bool(testing_ops.cuda_sym_kernel_usable(torch.zeros(1, device="cuda"), "float16"))
    kernel_configs = list(testing_ops.cuda_sym_configs()) if kernel_ok else []
    print(f"sm_90a kernel usable here: {kernel_ok}", flush=True)
    for model in args.model:
        product_table(model, model_matrices(model), args.iters, kernel_configs)
    paths = [p for p in args.paths if p != "sm90" or kernel_ok]
    for model in args.step_model:
        step_table(model, model_matrices(model), paths, args.iters, args.warmup)


def register(subparsers) -> None:
    parser = subparsers.add_parser("sym", help="symmetric products by path (portable, dense, sm_90a) and the "
                                               "one-GPU step with each path forced")
    parser.add_argument("--model", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "pi0"],
                        help="models whose Gram products are timed (manifest names or pi0)")
    parser.add_argument("--step-model", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-1.5b", "pi0"],
                        help="models whose whole DMuon.step is timed with each path forced")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=["dense", "portable", "blocks", "panels", "sm90"],
                        help="DMUON_SYM_PATH values of the step table, the first one timed again last")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions a round (median reported)")
    parser.add_argument("--warmup", type=int, default=4)
    parser.set_defaults(func=run)
