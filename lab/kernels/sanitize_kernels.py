"""Small runs of every CUDA kernel for compute-sanitizer (memcheck, racecheck):

    DMUON_AUTOTUNE=0 DMUON_AUTOTUNE_CACHE=none compute-sanitizer --tool memcheck python3 lab/kernels/sanitize_kernels.py [PART…]

PART (default: all of them): "sym", every symmetric-kernel configuration with and without
β·C on odd, padded shapes (split-K also with its slices forced); "ns", one Gram NS eagerly,
captured and replayed; "fused", the fused single-GPU step (check, momentum+normalize, apply)
on wide, tall, odd-sized and stacked matrices, with and without Nesterov.
"""

import sys

import torch

import dmuon
from dmuon._ops import testing_ops

PARTS = ("sym", "ns", "fused")
parts = sys.argv[1:] or list(PARTS)
unknown = [p for p in parts if p not in PARTS]
if unknown:
    raise SystemExit(f"sanitize_kernels.py: unknown part(s) {unknown}; choose from {PARTS}")


def run_sym():
    # Symmetric products: 3 × 203 × 333 (rows padded to 336), β·C with a padded C.
    ld = 336
    xp = torch.zeros(3, 203, ld, device="cuda", dtype=torch.half)[..., :333]
    xp.copy_(torch.randn(3, 203, 333, device="cuda") / 20)
    cp = torch.zeros(3, 203, 208, device="cuda", dtype=torch.half)[..., :203]
    cp.copy_(torch.randn(3, 203, 203, device="cuda"))
    cp = ((cp + cp.transpose(1, 2)) / 2).contiguous()
    cpp = torch.zeros(3, 203, 208, device="cuda", dtype=torch.half)[..., :203]
    cpp.copy_(cp)
    for config in testing_ops.cuda_sym_configs():
        testing_ops.cuda_sym_product_config(xp, xp, None, 1.0, 0.0, config)
        testing_ops.cuda_sym_product_config(xp, xp, cpp, 0.5, -0.25, config)
    # Tail split-K in its two forms: whole waves and a tail (9 tiles on 7 CTAs: 2 tail tiles in
    # 3 slices), and fewer tiles than CTAs (3 tiles in 5 slices); 21 k-tiles. mc2: 5 pairs on
    # 4 clusters (the tail pair a shadowed lone tile, in 4 slices), and 2 pairs (a column pair,
    # a shadowed tile) in 5 slices each.
    xk = torch.zeros(3, 203, 1336, device="cuda", dtype=torch.half)[..., :1333]
    xk.copy_(torch.randn(3, 203, 1333, device="cuda") / 40)
    for config, x_split in (("sm90:sk-tmastore:s5:c7", xk), ("sm90:sk-tmastore:s4:c0", xk[:1]),
                            ("sm90:mc2-sk-tmastore:s5:c8", xk), ("sm90:mc2-sk-tmastore:s5:c0", xk[:1])):
        testing_ops.cuda_sym_product_config(x_split, x_split, None, 1.0, 0.0, config)
        testing_ops.cuda_sym_product_config(x_split, x_split, cpp[: x_split.shape[0]], 0.5, -0.25, config)
    # Wide tmastore on a shape with every wide pair kind: 3 × 520 × 136, R = 5: row pairs, the
    # last row's pair over one A panel, lone units of two matrices paired and the third's shadowed.
    x5 = torch.randn(3, 520, 136, device="cuda", dtype=torch.half) / 12
    c5 = torch.randn(3, 520, 520, device="cuda")
    c5 = ((c5 + c5.transpose(1, 2)) / 2).half()
    for config in ("sm90:n256-tmastore:s4:c0", "sm90:mc2-n256-tmastore:s4:c0", "sm90:mc2-n256-tmastore:s4:c2",
                   "sm90:mc2-n256-tmastore:s3:c0", "sm90:mc2-n256-tmastore:s3:c2", "sm90:n256-tmastore:s3:c0"):
        testing_ops.cuda_sym_product_config(x5, x5, None, 1.0, 0.0, config)
        testing_ops.cuda_sym_product_config(x5, x5, c5, 0.5, -0.25, config)
    # The split: 1 × 520 × 1336 (21 k-tiles) on 2 clusters, 5 units: 4 whole, the shadowed lone
    # one in 2 slices; on every cluster: the 5 units in 5 slices each.
    x5k = torch.randn(1, 520, 1336, device="cuda", dtype=torch.half) / 40
    for config in ("sm90:mc2-n256-sk-tmastore:s4:c4", "sm90:mc2-n256-sk-tmastore:s4:c0", "sm90:mc2-n256-sk-tmastore:s3:c4"):
        testing_ops.cuda_sym_product_config(x5k, x5k, None, 1.0, 0.0, config)
        testing_ops.cuda_sym_product_config(x5k, x5k, c5[:1], 0.5, -0.25, config)


def run_ns():
    # One Gram NS: eager, captured, replayed.
    c, r = dmuon._C.default_schedule("gram", 5)
    x = torch.randn(2, 130, 300, device="cuda")
    for _ in range(3):
        out = testing_ops.orthogonalize(x, "gram", [v for t in c for v in t], list(r), 1e-7, "cuda", "float16")
    return out


def run_fused():
    # The fused step: flat and tiled passes, transposed and not, vectorized and not; step 1
    # ungated, step 2 gated, steps 3 and 4 gated on two streams (the default).
    # NOTE: two NS steps: the NS kernels are the "ns" part's. With the environment of the
    # header (no autotuning) racecheck of this part took 18 s on an H200; two earlier
    # attempts were cut at 250 and 270 s.
    torch.manual_seed(0)
    # NOTE: (96, 64) and (200, 68) take the vectorized transposing kernels, (130, 66) the scalar ones.
    shapes = [(64, 96), (96, 64), (127, 301), (200, 68), (130, 66), (3, 40, 72)]
    params = [torch.nn.Parameter(torch.randn(*s, device="cuda")) for s in shapes]
    opt = dmuon.DMuon([dict(params=params[:4]), dict(params=params[4:], nesterov=False, ns_algorithm="standard")],
                      lr=0.02, weight_decay=0.01, math=dmuon.MuonMath(ns_steps=2))
    for _ in range(4):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    return params, opt.runtime.last_stats


if "sym" in parts:
    run_sym()
out = run_ns() if "ns" in parts else None
params, stats = run_fused() if "fused" in parts else ([], None)
torch.cuda.synchronize()
print("sanitize script ok", parts, out is None or bool(torch.isfinite(out).all()),
      testing_ops.cuda_graph_stats(out) if out is not None else "",
      f"fused {stats.num_fused}/{len(params)}" if stats is not None else "",
      all(bool(torch.isfinite(p).all()) for p in params))
