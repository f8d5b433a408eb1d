"""Time the sm_90a symmetric-product configurations against cuBLAS (torch.bmm/baddbmm).

    python3 lab/kernels/sym_kernel_bench.py [--configs sm90:staged:s4:c0 ...] [--split-k] [--experimental]

For every shape (m×k, batch, with or without β·C): cuBLAS's dense product, each kernel
configuration, and (--split-k) the best configuration and cuBLAS again at k doubled: with
t(k) ≈ fill+epilogue + k·mainloop, the intercept 2·t(k) − t(2k) is the per-call time that
does not scale with k (epilogue, pipeline fill, launch). TFLOP/s are "executed": the
kernel's lower-triangle tiles (2·128²·k each), cuBLAS's full m²k.
The default list (the autotuner's candidates) holds one 128×128 2-CTA cluster configuration
("sm90:mc2-tmastore:s5:c0") and the 128×256 tmastore ones ("sm90:n256-tmastore:s3:c0",
"sm90:mc2-n256-tmastore:s3:c0", "sm90:mc2-n256-sk-tmastore:s3:c0"); in a build with
-DDMUON_EXPERIMENTAL_KERNELS=ON it holds the other cluster and 128×256 ones as well
(--experimental: refuse to run without them); any built name can also be given to --configs. With cluster or
128×256 names in the list, "old" (the baseline) defaults to the 1-CTA 128×128 configurations
and "new" to the others.
Times: CUDA events. cuBLAS and every configuration of a shape are timed in turns, --rounds
rounds (default 3, the order rotated each round; dmuon.cli.bench.timing.interleaved_ms), each the
median of its rounds: under the power limit the clock follows the recent load, and timings
taken one configuration after another drifted by up to 8% (the same kernel twice, 3584×18944 X·Xᵀ b15,
H200).
"""

from __future__ import annotations

import argparse

import torch

from dmuon._ops import testing_ops
from dmuon.cli.bench import sym, timing

# (m, k, batch, with β·C): the Gram products X·Xᵀ and the m³ products of Qwen2.5 0.5B–7B.
SHAPES = [
    (896, 4864, 72, False),
    (1536, 8960, 28, False),
    (1536, 8960, 84, False),
    (3584, 18944, 1, False),
    (3584, 18944, 7, False),
    (896, 896, 72, True),
    (1536, 1536, 56, True),
    (1536, 1536, 84, True),
    (3584, 3584, 7, True),
    (3584, 3584, 28, True),
    (256, 1536, 56, False),
]


def timed_iters(probe_ms: float, rounds: int, budget_ms: float = 60.0) -> int:
    """Timings a round so that all rounds take about budget_ms (5 to 50 a round)."""
    return int(min(50, max(5, budget_ms / rounds / max(probe_ms, 1e-3))))


def time_shape(m, k, batch, with_c, configs, rounds=3):
    """{name: ms} for cuBLAS ("cublas") and every configuration that runs, timed in turns on
    bench sym's operands (rows padded to 8 elements), each with its own timing count."""
    product = {"batch": batch, "m": m, "k": k, "with_c": with_c, "same_operands": not with_c}
    fns, failed = sym.product_fns(product, configs)
    for failure in failed:  # an unbuilt or inapplicable configuration
        print(f"  {failure[:120]}")
    # NOTE: two warm-ups, one probe: its time sets the configuration's timings a round.
    iters = {name: timed_iters(timing.cuda_time_ms(fn, 2, 1), rounds) for name, fn in fns.items()}
    out = timing.interleaved_ms(fns, iters, rounds)
    del fns
    torch.cuda.empty_cache()
    return out


def is_cluster_or_wide(config: str) -> bool:
    """The 2-CTA cluster ("sm90:mc2-…") and 128×256-unit ("sm90:n256-…") configurations."""
    return config.startswith(("sm90:mc2-", "sm90:n256-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="*", default=None, help="default: testing_ops.cuda_sym_configs()")
    parser.add_argument("--old", nargs="*", default=None,
                        help="the baseline set (default: the staged/direct configurations)")
    parser.add_argument("--split-k", action="store_true", help="also time k doubled (intercept)")
    parser.add_argument("--shapes", nargs="*", default=None, help="MxKxB[c] (c: with β·C)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds in which cuBLAS and every configuration are timed in turns (median)")
    parser.add_argument("--experimental", action="store_true",
                        help="require a build with -DDMUON_EXPERIMENTAL_KERNELS=ON (every mc2 and n256 configuration)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.experimental and not any(":n256-staged:" in c for c in testing_ops.cuda_sym_configs()):
        parser.error("--experimental: this build has no experimental configurations "
                     "(build with -DDMUON_EXPERIMENTAL_KERNELS=ON)")
    configs = args.configs if args.configs is not None else list(testing_ops.cuda_sym_configs())
    if args.old is not None:
        old = set(args.old)
    elif any(is_cluster_or_wide(c) for c in configs):
        old = {c for c in configs if not is_cluster_or_wide(c)}
    else:
        old = {c for c in configs if c.split(":")[1] in ("staged", "direct")}
    shapes = SHAPES
    if args.shapes:
        shapes = []
        for s in args.shapes:
            with_c = s.endswith("c")
            m, k, b = (int(v) for v in s.rstrip("c").split("x"))
            shapes.append((m, k, b, with_c))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print("configs:", " ".join(configs))

    rows = []
    for m, k, batch, with_c in shapes:
        times = time_shape(m, k, batch, with_c, configs, args.rounds)
        tiles = (m + 127) // 128
        tri_flop = batch * tiles * (tiles + 1) // 2 * 2 * 128 * 128 * k
        dense_flop = 2 * batch * m * m * k
        print(f"{m}x{k} b{batch}{' +C' if with_c else ''}: " +
              "  ".join(f"{n} {t:.4f}" for n, t in times.items()))
        olds = {n: t for n, t in times.items() if n in old}
        news = {n: t for n, t in times.items() if n != "cublas" and n not in old}
        best_old = min(olds, key=olds.get) if olds else None
        best_new = min(news, key=news.get) if news else None
        row = dict(shape=f"{m}x{k}{'+C' if with_c else ''}", batch=batch, cublas=times["cublas"],
                   old=best_old, old_ms=olds.get(best_old), new=best_new, new_ms=news.get(best_new),
                   tri_flop=tri_flop, dense_flop=dense_flop)
        if args.split_k:
            best = best_new if best_new and news[best_new] < (olds.get(best_old) or 1e9) else best_old
            names = [best] + ([best_old] if best != best_old and best_old else [])
            t2 = time_shape(m, 2 * k, batch, with_c, names, args.rounds)
            row["split"] = {n: (times[n], t2[n], 2 * times[n] - t2[n]) for n in names}
            row["split"]["cublas"] = (times["cublas"], t2["cublas"], 2 * times["cublas"] - t2["cublas"])
        rows.append(row)

    # Table.
    print()
    print(f"{'shape':>14} {'b':>3} {'cuBLAS ms':>10} {'old ms':>9} {'new ms':>9} {'old x':>6} {'new x':>6} "
          f"{'new/old':>7} {'oldTF':>6} {'newTF':>6} {'cubTF':>6}  best old / best new")
    for r in rows:
        o, n, cb = r["old_ms"], r["new_ms"], r["cublas"]
        tf = lambda flop, ms: f"{flop / ms / 1e9:6.0f}" if ms else "     -"  # noqa: E731
        print(f"{r['shape']:>14} {r['batch']:>3} {cb:10.4f} {o or 0:9.4f} {n or 0:9.4f} "
              f"{cb / o if o else 0:6.2f} {cb / n if n else 0:6.2f} {o / n if (o and n) else 0:7.3f} "
              f"{tf(r['tri_flop'], o)} {tf(r['tri_flop'], n)} {tf(r['dense_flop'], cb)}  {r['old']} / {r['new']}")
    if any("split" in r for r in rows):
        print()
        print("k doubled: name t(k) t(2k) intercept=2t(k)-t(2k) [ms], intercept share of t(k)")
        for r in rows:
            for name, (t1, t2, icpt) in r.get("split", {}).items():
                print(f"{r['shape']:>14} b{r['batch']:<3} {name:>22} {t1:9.4f} {t2:9.4f} {icpt:9.4f} "
                      f"{icpt / t1:6.1%}")


if __name__ == "__main__":
    main()
