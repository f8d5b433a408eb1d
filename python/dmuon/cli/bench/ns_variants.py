"""`python -m dmuon bench ns --model NAME --variants default,split_qkv,…`: one DMuon.step
(fp32 parameters of a decoder's Muon matrices, every gradient present) per variant of the
group options, all timed in turns in the same run, each against the "default" variant.

A variant is a name → builder of the model's Muon param groups (VARIANTS): each group is a
list of matrix shapes and the group options it runs with, so a new option (e.g. a NorMuon
group option) adds one entry. The split variants store the matrices the way
checkpoints of fused models do and split them back:
  default        q, k, v, o, gate, up, down as separate matrices, whole
  split_qkv      one fused [q + k + v, h] per layer, split_rows = (q, k, v)
  split_gate_up  one fused [2·i, h] per layer, split_rows = (i, i)
  split_heads    q, k, v separate, each split per head (split_heads = its heads)
  split_heads_o  split_heads, and o split per head too (its column blocks: split_dim=1;
                 strided pieces read in place, dmuon.split_options; CPU step ops only so far)
  normuon        default's matrices with NorMuon (Li et al., 2025): a row second moment per
                 matrix, rows normalized after NS (its state exchanged with the owners)
split_qkv and split_gate_up run the same Newton–Schulz work as default (same block shapes):
their difference to it is the cost of splitting. split_heads runs smaller matrices (other
math). Every variant's parameters, gradients and momentum are alive together (they are timed
in turns): about 12 bytes per parameter per variant, ~65 GB for four Qwen2.5-1.5B variants;
time larger models with fewer variants per run. Runs on CUDA (CUDA-event medians) or,
without a GPU, on the CPU (wall-clock medians; for a smoke run with --model tiny).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

# (shapes, group options) of each Muon group of a model; dims = (hidden, intermediate, layers, heads, kv heads).
Groups = list[tuple[list[tuple[int, int]], dict[str, Any]]]


def _attention(dims, fused: bool) -> list[tuple[int, int]]:
    h, _, _, heads, kv = dims
    d = h // heads
    return [(h + 2 * kv * d, h)] if fused else [(h, h), (kv * d, h), (kv * d, h)]


def _mlp(dims, fused: bool) -> list[tuple[int, int]]:
    h, i = dims[0], dims[1]
    return [(2 * i, h)] if fused else [(i, h), (i, h)]


def default(dims) -> Groups:
    h, i, layers = dims[0], dims[1], dims[2]
    per_layer = _attention(dims, False) + [(h, h)] + _mlp(dims, False) + [(h, i)]
    return [(per_layer * layers, {})]


def split_qkv(dims) -> Groups:
    h, i, layers, heads, kv = dims
    d = h // heads
    rest = [(h, h)] + _mlp(dims, False) + [(h, i)]
    return [(_attention(dims, True) * layers, {"split_rows": [h, kv * d, kv * d]}), (rest * layers, {})]


def split_gate_up(dims) -> Groups:
    h, i, layers = dims[0], dims[1], dims[2]
    rest = _attention(dims, False) + [(h, h), (h, i)]
    return [(_mlp(dims, True) * layers, {"split_rows": [i, i]}), (rest * layers, {})]


def split_heads(dims) -> Groups:
    h, i, layers, heads, kv = dims
    d = h // heads
    rest = [(h, h)] + _mlp(dims, False) + [(h, i)]
    return [([(h, h)] * layers, {"split_heads": heads}), ([(kv * d, h)] * (2 * layers), {"split_heads": kv}),
            (rest * layers, {})]


def split_heads_o(dims) -> Groups:
    h, i, layers, heads, kv = dims
    d = h // heads
    rest = _mlp(dims, False) + [(h, i)]
    return [([(h, h)] * layers, {"split_heads": heads}), ([(kv * d, h)] * (2 * layers), {"split_heads": kv}),
            ([(h, h)] * layers, {"split_heads": heads, "split_dim": 1}), (rest * layers, {})]


def normuon(dims) -> Groups:
    return [(shapes, {**options, "normuon": True}) for shapes, options in default(dims)]


VARIANTS: dict[str, Callable[[tuple], Groups]] = {
    "default": default, "split_qkv": split_qkv, "split_gate_up": split_gate_up, "split_heads": split_heads,
    "split_heads_o": split_heads_o, "normuon": normuon,
}


def parse_variants(text: str) -> list[str]:
    """A comma list of VARIANTS names; "default" is always timed (first) as the baseline."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    return ["default"] + [n for n in dict.fromkeys(names) if n != "default"]


def make_step(groups: Groups, device: torch.device) -> tuple[Callable[[], Any], int]:
    """DMuon.step over fresh fp32 parameters of `groups` (gradients set); and its parameter count."""
    from dmuon.cli.bench.local_ns import local_dmuon

    gen = torch.Generator(device=device).manual_seed(0)
    param_groups, numel = [], 0
    for g_idx, (shapes, options) in enumerate(groups):
        params = []
        for k, (rows, cols) in enumerate(shapes):
            p = torch.nn.Parameter(torch.randn(rows, cols, device=device, generator=gen) * 0.02)
            p.grad = torch.randn(rows, cols, device=device, generator=gen) * 1e-3
            params.append((f"g{g_idx}.m{k}", p))
            numel += rows * cols
        param_groups.append({"params": params, "use_muon": True, **options})
    return local_dmuon(param_groups).step, numel


def run_variants(args, dims_of: Callable[[str], tuple]) -> None:
    """The variants table of every --model (the time of each step and its ratio to default)."""
    from dmuon.cli.bench.timing import interleaved_ms, wall_time_ms

    names = parse_variants(args.variants)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    for model in args.model:
        dims = dims_of(model)
        steps, counts = {}, {}
        for name in names:
            steps[name], counts[name] = make_step(VARIANTS[name](dims), device)
        # NOTE: the first steps tune and capture (CUDA): warm-up before any timing.
        warmup = max(args.warmup, 4)
        for step in steps.values():
            for _ in range(warmup):
                step()
        if cuda:
            torch.cuda.synchronize()
            times = interleaved_ms(steps, args.iters, rounds=5)
        else:
            times = interleaved_ms(steps, args.iters, rounds=3, timer=wall_time_ms)
        base = times["default"]
        print(f"\nmodel {model} variants on {device.type} ({'CUDA-event' if cuda else 'wall-clock'} medians, "
              "timed in turns):")
        print(f"{'variant':16s} {'params M':>9s} {'step ms':>9s} {'vs default':>11s}")
        for name in names:
            print(f"{name:16s} {counts[name] / 1e6:9.2f} {times[name]:9.3f} {100 * (times[name] / base - 1):+10.1f}%",
                  flush=True)
        del steps
        if cuda:
            torch.cuda.empty_cache()
