"""`python -m dmuon bench ns --model NAME`: the single-GPU optimizer step `dmuon.DMuon.step`
(fp32 parameters: momentum, Newton–Schulz, apply) over every Muon matrix of a model manifest,
against torch.optim.Muon, a plain batched PyTorch Newton–Schulz step and torch's fused AdamW,
all measured in the same run; plus every configuration of the symmetric kernel against
cuBLAS's dense product for X·Xᵀ.

Times are CUDA-event medians after warm-up. TFLOP/s are "executed" (the FLOPs each method
actually performs) against the dense bf16 peak measured in the same run, and
"NS-equivalent" (5·(4m²n + 2m³) per matrix, m ≤ n: standard NS with dense products).
After each model's table come two floors of the step (csrc/ns/ns_bound.h): every kernel at
the measured peak, and every distinct product at the best time torch's batched GEMM or
cuBLASLt's heuristic algorithms take for its shape in the same run (what the step would cost
at the GEMM library's efficiency per FLOP).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from dmuon.cli.bench.environment import environment_line
from dmuon.cli.bench.local_ns import chunks, local_dmuon, model_params, model_shapes, orthogonalize_all
from dmuon.cli.bench.memory import release
from dmuon.cli.bench.timing import alternating_ms, cuda_time_ms, interleaved_ms

# NOTE: for smoke runs (CPU) of --variants: (hidden, intermediate, layers, heads, kv heads).
_TINY_DIMS = (64, 160, 2, 4, 2)


def design_dims(name: str) -> tuple:
    """(hidden, intermediate, layers, heads, kv heads) of a shipped decoder (its public
    config, e2e_models.HF_CONFIGS) or of "tiny"."""
    from dmuon.cli.bench.e2e_models import HF_CONFIGS

    if name.lower() == "tiny":
        return _TINY_DIMS
    if name.lower() not in HF_CONFIGS:
        raise ValueError(f"--model {name!r} has no decoder dimensions here; choose one of tiny, {', '.join(HF_CONFIGS)}")
    c = HF_CONFIGS[name.lower()][1]
    return (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
            c["num_key_value_heads"])


def dense_bf16_peak_tflops() -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = cuda_time_ms(lambda: a @ b, 3, 10)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def copy_bandwidth_gbs(mib: int = 1024, device: str = "cuda") -> float:
    """A device-to-device copy of `mib` MiB: bytes read and written per second, in GB/s."""
    src = torch.empty(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), 3, 20)
    return 2 * mib * 2**20 / (ms * 1e-3) / 1e9


def ns_equivalent_flops(shapes) -> float:
    total = 0.0
    for batch, rows, cols in shapes:
        m, n = min(rows, cols), max(rows, cols)
        total += batch * 5 * (4 * m * m * n + 2 * m**3)
    return total


def gram_symmetric_flops(shapes) -> float:
    """Gram NS, 5 steps, one restart, symmetric products at half cost: 6m²n + 14m³."""
    total = 0.0
    for batch, rows, cols in shapes:
        m, n = min(rows, cols), max(rows, cols)
        total += batch * (6 * m * m * n + 14 * m**3)
    return total


def plain_batched_ns_(groups: dict, steps: int = 5) -> None:
    """Keller Jordan's quintic in bf16 over stacked same-shape updates (in place), in batches
    of at most 2 GiB of fp32 matrices (the 7B stacks would not fit next to the model)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    for key, (params, bufs) in groups.items():
        for part in chunks(list(range(len(bufs))), key[1] * key[2]):
            x = torch.stack([bufs[i] for i in part]).to(torch.bfloat16)
            if x.shape[-2] > x.shape[-1]:
                x = x.transpose(-2, -1)
            x = x / x.flatten(1).norm(dim=1).clamp_min(1e-7).view(-1, 1, 1)
            for _ in range(steps):
                A = x @ x.transpose(-2, -1)
                B = torch.baddbmm(A, A, A, beta=b, alpha=c)
                x = torch.baddbmm(x, B, x, beta=a, alpha=1.0)
            if key[1] > key[2]:
                x = x.transpose(-2, -1)
            torch._foreach_add_([params[i] for i in part], list(x.float().unbind(0)), alpha=-0.02)


def sym_kernel_table(args, testing_ops, kernel_ok: bool) -> None:
    """X·Xᵀ in fp16: cuBLAS dense vs every built configuration of the symmetric kernel, all
    timed in turns (interleaved_ms, 3 rotated rounds); then cuBLAS against the fastest of
    them in 5 alternating rounds, the figure the kernel target is read from."""
    from dmuon.cli.bench.sym import product_fns

    configs = list(testing_ops.cuda_sym_configs()) if kernel_ok and hasattr(testing_ops, "cuda_sym_configs") else []
    for m, k in [(int(s.split("x")[0]), int(s.split("x")[1])) for s in args.sym_shapes]:
        fns, _ = product_fns({"batch": 1, "m": m, "k": k, "with_c": False, "same_operands": True}, configs)
        iters = max(args.iters * 4, 20)
        if not configs:
            dense_ms = cuda_time_ms(fns["cublas"], 3, iters)
            print(f"X·Xᵀ {m}x{k} fp16: cuBLAS dense {dense_ms:.3f} ms ({2 * m * m * k / dense_ms / 1e9:.0f} TFLOP/s), "
                  "dmuon sym kernel: not usable on this GPU/build", flush=True)
            del fns
            continue
        # NOTE: in turns, not one after another: sequential timings drifted by up to 8%
        # under the power limit (the same kernel twice, H200), as much as the configurations differ.
        timed = interleaved_ms(fns, iters, rounds=3)
        dense_ms = timed.pop("cublas")
        best = min(timed, key=timed.get)
        dense_r, best_r = alternating_ms(fns["cublas"], fns[best], iters)
        print(f"X·Xᵀ {m}x{k} fp16: in turns cuBLAS dense {dense_ms:.3f} ms ({2 * m * m * k / dense_ms / 1e9:.0f} TFLOP/s), "
              f"best sym config {best} {timed[best]:.3f} ms (speed-up {dense_ms / timed[best]:.2f}x); "
              f"alternating rounds: cuBLAS {dense_r:.3f} ms, {best} {best_r:.3f} ms, speed-up {dense_r / best_r:.2f}x; "
              + ", ".join(f"{c.split(':', 1)[1]} {t:.3f}" for c, t in timed.items()), flush=True)
        del fns
    release("cuda")


def profile_step(step, warmup: int) -> None:
    """Where one warm DMuon.step spends its time: the top CUDA kernels and the host wall."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from dmuon.cli.bench.timeline import format_timeline, profiler_timeline

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("dmuon.DMuon.step"):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    cuda_total = sum(e.self_device_time_total for e in events) / 1e3
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                                                         "cudaGraphLaunch", "cublasLtMatmul"))
    print(f"  profile of one step: {cuda_total:.2f} ms of device time, {launches} launches; top kernels:")
    print(events.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60))
    # NOTE: the step's time is its host range: host work before the first kernel, between
    # kernels (host waits) and after the last one all count in the CUDA-event timing.
    print(format_timeline(profiler_timeline(prof, "dmuon.DMuon.step")))


def floor_parts(bound: dict) -> str:
    """A step bound's total and its parts in ms: "T ms = NS n (symmetric, dense, add_identity) + passes p"."""
    ms = {key: bound[key] * 1e3 for key in ("seconds", "ns_seconds", "sym_seconds", "dense_seconds",
                                            "elementwise_seconds", "passes_seconds")}
    return (f"{ms['seconds']:.2f} ms = NS {ms['ns_seconds']:.2f} (symmetric {ms['sym_seconds']:.2f}, "
            f"dense {ms['dense_seconds']:.2f}, add_identity {ms['elementwise_seconds']:.2f}) "
            f"+ passes {ms['passes_seconds']:.2f}")


def format_floor(bound: dict, step_ms: float) -> str:
    """One line: the design's floor of the step (ns/ns_bound.h) and the step's share of it."""
    return (f"floor of this design (each NS kernel at the larger of its FLOPs at the peak and its bytes at the "
            f"device copy's rate, one after another, {bound['ns_flops'] / 1e12:.2f} TFLOP and "
            f"{bound['ns_bytes'] / 1e9:.1f} GB; memory passes {bound['pass_bytes'] / 1e9:.1f} GB): "
            f"{floor_parts(bound)}; dmuon step at {100 * bound['seconds'] * 1e3 / step_ms:.0f}% of it")


def dense_product_seconds(product: dict, dtype: torch.dtype, iters: int = 10,
                          device: str = "cuda") -> tuple[float, float]:
    """Times (s) of one product of `dmuon.analysis.step_products` as a GEMM library runs it: D = A·Bᵀ for
    a symmetric product (B m×k; B is A where the product shares its operands), D = A·B for a
    dense one, plus β·C where it has one. Returns (torch's batched GEMM, median of `iters`;
    the fastest of cuBLASLt's heuristic algorithms timed in turns, NaN where not measured)."""
    testing_ops = torch.ops.dmuon_testing
    b, m, n, k = product["batch"], product["m"], product["n"], product["k"]
    symmetric = product["kind"] == "symmetric"
    # NOTE: operands scaled to unit-size products, so fp16 stays finite whatever k is.
    a = torch.randn(b, m, k, device=device, dtype=dtype) / math.sqrt(k)
    if symmetric:
        rhs = a if product["same_operands"] else torch.randn(b, m, k, device=device, dtype=dtype)
    else:
        rhs = torch.randn(b, k, n, device=device, dtype=dtype)
    c = torch.randn(b, m, n, device=device, dtype=dtype) if product["with_c"] else None
    op_b = rhs.transpose(1, 2) if symmetric else rhs

    def fn():
        return torch.bmm(a, op_b) if c is None else torch.baddbmm(c, a, op_b, beta=0.5)

    torch_s = cuda_time_ms(fn, 3, iters) * 1e-3
    lt_s = float("nan")
    if a.is_cuda and hasattr(testing_ops, "cuda_gemm_algo_ms"):
        times = [t for t in testing_ops.cuda_gemm_algo_ms(a, rhs, c, 0.5 if c is not None else 0.0, symmetric)
                 if not math.isnan(t)]
        lt_s = min(times) * 1e-3 if times else float("nan")
    del a, rhs, c, fn
    return torch_s, lt_s


def measured_floor(batches: list, algorithm: str, num_steps: int, copy_gbs: float, iters: int = 10,
                   time_product=dense_product_seconds) -> dict:
    """The step's floor (ns/ns_bound.h, measured_step_bound) with every product at the best
    time a GEMM library took for its shape here (torch's GEMM, or cuBLASLt's fastest
    heuristic algorithm); `batches` are the step's (matrices, rows, cols). Also
    "torch_seconds", the same floor at torch's times alone, and "lt_faster", the count of
    products where an algorithm beat torch."""
    from dmuon import analysis

    # NOTE: the iterate's dtype as the fused step runs it (fp16 for Gram schedules, else bf16).
    dtype = torch.float16 if algorithm == "gram" else torch.bfloat16
    products = analysis.step_products(batches, algorithm, num_steps)
    timed = [time_product(p, dtype, iters) for p in products]
    torch_times = [t for t, _ in timed]
    best_times = [t if math.isnan(lt) else min(t, lt) for t, lt in timed]
    bound = analysis.measured_step_bound(batches, algorithm, num_steps, best_times, copy_gbs * 1e9)
    bound["torch_seconds"] = analysis.measured_step_bound(batches, algorithm, num_steps, torch_times,
                                                          copy_gbs * 1e9)["seconds"]
    bound["products"] = len(products)
    bound["lt_faster"] = sum(1 for t, lt in timed if lt < t)
    return bound


def format_measured_floor(bound: dict, step_ms: float) -> str:
    """One line: the floor with each product at a GEMM library's best time for its shape."""
    return (f"floor at this GPU's GEMM rates ({bound['products']} distinct products, each at the best time of "
            f"torch's batched GEMM and cuBLASLt's heuristic algorithms for its shape in this run, the algorithms "
            f"faster for {bound['lt_faster']}; symmetric ones at half of it; add_identity and passes at the copy "
            f"rate): {floor_parts(bound)} (at torch's times alone {bound['torch_seconds'] * 1e3:.2f}); "
            f"dmuon step at {100 * bound['seconds'] * 1e3 / step_ms:.0f}% of it")


def run(args) -> None:
    from dmuon import analysis
    from dmuon.cli.usage import input_checks

    if args.variants:
        from dmuon.cli.bench.ns_variants import parse_variants, run_variants

        with input_checks():
            parse_variants(args.variants)
            for model in args.model:
                design_dims(model)
        run_variants(args, design_dims)
        return
    with input_checks():
        for model in args.model:
            model_shapes(model)
    if not torch.cuda.is_available():
        raise SystemExit("bench ns needs a CUDA GPU")
    testing_ops = torch.ops.dmuon_testing
    torch.manual_seed(0)
    print(environment_line("cuda"))
    peak = dense_bf16_peak_tflops()
    print(f"dense bf16 peak (8192^3 matmul, same run): {peak:.0f} TFLOP/s", flush=True)
    copy_gbs = copy_bandwidth_gbs()
    print(f"device copy (1 GiB, same run): {copy_gbs:.0f} GB/s read + written", flush=True)
    kernel_ok = hasattr(testing_ops, "cuda_sym_kernel_usable") and testing_ops.cuda_sym_kernel_usable(
        torch.zeros(1, device="cuda"), "float16")
    if args.sym_shapes:
        sym_kernel_table(args, testing_ops, kernel_ok)

    for model in args.model:
        shapes = model_shapes(model)
        ns_eq = ns_equivalent_flops(shapes)
        executed_dmuon = gram_symmetric_flops(shapes) * (1 if kernel_ok else 2)
        params = model_params(shapes)
        numel = sum(p.numel() for p in params)
        results = OrderedDict()
        # NOTE: the first steps tune every configuration and capture the graphs (step 2 on
        # the caller's stream; the second stream's from step 3, captured at step 4); they are
        # warm-up, never timed.
        warmup = max(args.warmup, 4)

        def measure(name, make_step, executed, iters=args.iters, warm=args.warmup):
            step = make_step()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                ms = cuda_time_ms(step, warm, iters)
            except torch.OutOfMemoryError:
                print(f"{name}: out of memory", flush=True)
                ms = float("nan")
            extra = (torch.cuda.max_memory_allocated() - base) / 2**30
            results[name] = (ms, executed, extra)
            print(f"  {name}: {ms:.2f} ms", flush=True)
            if args.host_ahead and not math.isnan(ms):
                ahead = cuda_time_ms(step, 0, iters, host_ahead=True)
                results[f"{name}, host ahead"] = (ahead, executed, extra)
                print(f"  {name}, host ahead: {ahead:.2f} ms (launch lead {ms - ahead:.2f} ms)", flush=True)
            del step
            release("cuda")

        last_dmuon = {}

        def dmuon_name(bucket_mb, streams=0):
            return f"dmuon.DMuon.step (bucket {bucket_mb:g} MiB)" + (f", {streams} streams" if streams else "")

        def dmuon_step(bucket_mb, streams=0):
            def make():
                # NOTE: fused_streams None (streams 0): DMUON_FUSED_STREAMS or its default.
                opt = local_dmuon(params, bucket_size_mb=bucket_mb, fused_streams=streams or None)
                last_dmuon["runtime"] = opt.runtime  # NOTE: built now, before the timed steps
                # NOTE: the floor below counts the kernels of the schedule the step runs.
                group = opt.param_groups[0]
                last_dmuon["schedule"] = (group["ns_algorithm"], group["ns_steps"])
                return opt.step
            return make

        def report_path():
            # What the timed steps ran: one process runs one stage of NS batches (no buckets).
            runtime = last_dmuon.pop("runtime")
            stats = runtime.last_stats
            if stats.num_fused == len(params):
                last_dmuon["batches"] = list(stats.fused_batches)
            print(f"    path: {type(runtime).__name__}, {stats.num_fused} of {len(params)} parameters fused "
                  f"({stats.num_fused_batches} batches on {stats.num_fused_streams} streams), "
                  f"{stats.num_buckets} buckets for the rest", flush=True)
            release("cuda")

        def torch_muon_step():
            opt = torch.optim.Muon([p for p in params if p.dim() == 2], lr=0.02, weight_decay=0.0)
            return opt.step

        def plain_step():
            bufs = [torch.zeros_like(p) for p in params]
            groups: dict = OrderedDict()  # (0, rows, cols) → (param matrices, buffer matrices)
            for p, buf in zip(params, bufs):
                for pm, bm in zip(p.reshape(-1, *p.shape[-2:]), buf.reshape(-1, *buf.shape[-2:])):
                    entry = groups.setdefault((0, pm.shape[0], pm.shape[1]), ([], []))
                    entry[0].append(pm)
                    entry[1].append(bm)
            grads = [p.grad for p in params]

            def step():
                torch._foreach_lerp_(bufs, grads, 0.05)
                plain_batched_ns_(groups)
            return step

        def adamw_step():
            opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
            return opt.step

        print(f"model {model}: timing", flush=True)
        for bucket_mb in args.bucket_mb:
            measure(dmuon_name(bucket_mb), dmuon_step(bucket_mb), executed_dmuon,
                    warm=warmup)
            report_path()
        for streams in args.fused_streams:
            measure(dmuon_name(args.bucket_mb[-1], streams), dmuon_step(args.bucket_mb[-1], streams=streams),
                    executed_dmuon, warm=warmup)
            report_path()
        if args.profile:
            profile_step(dmuon_step(args.bucket_mb[-1])(), warmup)
            report_path()
        if not args.skip_baselines:
            measure("torch.optim.Muon", torch_muon_step, ns_eq)
            measure("plain batched PyTorch NS (bf16)", plain_step, ns_eq)
        measure("torch AdamW (fused)", adamw_step, 0.0)

        if args.ns_only:
            # NS alone per backend, on same-shape batches (≤ 2 GiB each).
            groups: dict = OrderedDict()
            for p in params:
                groups.setdefault(tuple(p.shape[-2:]), []).append(p.grad.reshape(-1, *p.shape[-2:]))
            stacks = [torch.cat([g[j] for j in part]) for g in groups.values()
                      for part in chunks(list(range(len(g))), g[0].shape[-2] * g[0].shape[-1])]
            for backend in (["cuda"] if kernel_ok else []) + ["cuda_dense"]:
                executed = gram_symmetric_flops(shapes) * (1 if backend == "cuda" else 2)
                measure(f"NS only (orthogonalize op), backend {backend}",
                        lambda backend=backend: orthogonalize_all(stacks, backend), executed, warm=warmup)
            del stacks, groups

        base = results["torch.optim.Muon"][0] if "torch.optim.Muon" in results else float("nan")
        adamw = results["torch AdamW (fused)"][0]
        print(f"\nmodel {model}: {len(shapes)} Muon matrices, {numel / 1e9:.2f} B parameters, "
              f"NS-equivalent {ns_eq / 1e12:.2f} TFLOP per step; peak {peak:.0f} TFLOP/s; "
              f"exec TF/s of dmuon counts Gram NS with symmetric products (6m²n+14m³)")
        print(f"{'method':44s} {'time ms':>9s} {'exec TF/s':>10s} {'% peak':>7s} {'NS-eq TF/s':>11s} "
              f"{'vs Muon':>8s} {'vs AdamW':>9s} {'peak+ GiB':>10s}")
        for name, (ms, executed, extra) in results.items():
            tf = executed / (ms * 1e-3) / 1e12
            print(f"{name:44s} {ms:9.2f} {tf:10.0f} {100 * tf / peak:6.0f}% {ns_eq / (ms * 1e-3) / 1e12:11.0f} "
                  f"{base / ms:7.2f}x {ms / adamw:8.2f}x {extra:10.2f}", flush=True)
        algorithm, num_steps = last_dmuon["schedule"]
        print(format_floor(analysis.fused_step_bound([(r, c) for b, r, c in shapes for _ in range(b)], algorithm,
                                               num_steps, peak * 1e12, copy_gbs * 1e9),
                           results[dmuon_name(args.bucket_mb[0])][0]), flush=True)
        # NOTE: the parameters go first: the 7B products need room next to nothing else.
        del params
        release("cuda")
        if "batches" in last_dmuon:
            measured = measured_floor(last_dmuon.pop("batches"), algorithm, num_steps, copy_gbs)
            print(format_measured_floor(measured, results[dmuon_name(args.bucket_mb[0])][0]), flush=True)
        else:
            print("floor at this GPU's GEMM rates: not measured (the step did not fuse every matrix)")


def register(subparsers) -> None:
    parser = subparsers.add_parser("ns", help="single-GPU Newton–Schulz optimizer step vs torch baselines")
    parser.add_argument("--model", action="append", required=True,
                        help="model manifest name (repeatable), e.g. qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[64.0],
                        help="DMuon bucket_size_mb values to time (0: one bucket)")
    parser.add_argument("--fused-streams", type=int, nargs="*", default=[],
                        help="also time DMuon.step with these stream counts of the fused step (the "
                             "first timing uses DMUON_FUSED_STREAMS, default 2)")
    parser.add_argument("--host-ahead", action="store_true",
                        help="also time each method with a spin kernel before the start event, so that "
                             "the host's launch lead is left out (device time only)")
    parser.add_argument("--profile", action="store_true",
                        help="print a torch.profiler summary of one DMuon.step (last bucket size)")
    parser.add_argument("--skip-baselines", action="store_true",
                        help="leave out torch.optim.Muon and the plain batched NS (fused AdamW stays): "
                             "for scans of dmuon settings; the 'vs Muon' column reads nan")
    parser.add_argument("--ns-only", action="store_true",
                        help="also time the orthogonalize op alone per backend (cuda, cuda_dense)")
    parser.add_argument("--sym-shapes", nargs="*", default=["3584x18944", "4096x14336", "896x4864"],
                        help="m x k shapes of the X·Xᵀ kernel comparison")
    parser.add_argument("--variants", default="",
                        help="comma list of group-option variants to time against 'default' in turns "
                             "(dmuon.cli.bench.ns_variants.VARIANTS: default, split_qkv, split_gate_up, split_heads, split_heads_o, "
                             "normuon); "
                             "times only those (on the CPU where no GPU is visible)")
    parser.set_defaults(func=run)
