"""One process's Muon step over a model's matrices, and its Newton–Schulz alone: the
parameters with random gradients (`model_params`) and the DMuon that steps them
(`local_dmuon`), which ``bench ns``, ``bench ns --variants`` and ``bench sym`` time; and the
one-GPU reference for a fake rank's Newton–Schulz (`local_ns_ms`): the time the local path
takes to orthogonalize the same matrices a rank owns, measured in the same run.

The matrices are grouped by shape into batches of at most 2 GiB (`chunks`, which ``bench
ns`` batches by too; its ``NS only`` line runs the same `orthogonalize_all`), and each batch
goes through ``torch.ops.dmuon_testing.orthogonalize`` with the tuned CUDA backend, timed with CUDA
events.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

# NOTE: same-shape matrices are orthogonalized in batches of at most 2 GiB of fp32 input
# (the runtime's buckets are smaller still): one batch of all 56 Qwen2.5-7B gate/up
# matrices would need 15 GiB for its input alone and ran out of memory next to the
# parameters, gradients and momentum on an H200 (141 GB).
_CHUNK_BYTES = 2 << 30


def model_shapes(name: str) -> list[tuple[int, int, int]]:
    """[(batch, rows, cols)] of every Muon matrix of a shipped model manifest."""
    from dmuon.cli.plan.manifest import load_model

    return [(m.batch, m.rows, m.cols) for m in load_model(name).matrices]


def model_params(shapes: list[tuple[int, int, int]], device: str = "cuda") -> list[torch.Tensor]:
    """fp32 parameters of (batch, rows, cols) matrices (a stack where batch > 1), each with a
    random gradient set."""
    params = [torch.randn(*((b,) if b > 1 else ()), r, c, device=device) * 0.02 for b, r, c in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def local_dmuon(params, **execution):
    """dmuon.DMuon over `params` (tensors or param groups) as the one-process benches step it:
    lr 0.02, no weight decay, `execution`'s further Execution fields.
    NOTE: one process: the plan is trivial, so the analytic cost model (no profiling)."""
    import dmuon

    return dmuon.DMuon(params, lr=0.02, weight_decay=0.0,
                       execution=dmuon.Execution(cost_model="analytic", **execution))


def chunks(indices: list[int], matrix_numel: int) -> list[list[int]]:
    """indices split into runs whose fp32 matrices total at most _CHUNK_BYTES."""
    per_chunk = max(1, _CHUNK_BYTES // (4 * matrix_numel))
    return [indices[i : i + per_chunk] for i in range(0, len(indices), per_chunk)]


def orthogonalize_all(stacks: list, backend: str):
    """A function that runs every same-shape batch of `stacks` through
    torch.ops.dmuon_testing.orthogonalize on `backend` (Gram NS, the default 5-step schedule, a
    float16 iterate): the one-GPU path a fake rank's NS and `bench ns --ns-only` are timed on."""
    from dmuon.analysis import default_schedule

    coefficients, restarts = default_schedule("gram", 5)
    flat, restarts = [x for c in coefficients for x in c], list(restarts)
    testing_ops = torch.ops.dmuon_testing

    def run():
        for s in stacks:
            testing_ops.orthogonalize(s, "gram", flat, restarts, 1e-7, backend, "float16")
    return run


def local_ns_ms(shapes: list[tuple[int, ...]], device: str, warmup: int = 1, iters: int = 3) -> float:
    """Median milliseconds of one pass over every matrix of `shapes` ((rows, cols) or
    (batch, rows, cols)), orthogonalized in same-shape batches on one `device`."""
    from dmuon.cli.bench.timing import cuda_time_ms

    if device != "cuda":
        raise ValueError(f"local_ns_ms measures the CUDA path; got device {device!r}")
    if not shapes:
        return 0.0
    counts: dict[tuple[int, int], int] = OrderedDict()
    for shape in shapes:
        rows, cols = shape[-2:]
        counts[(rows, cols)] = counts.get((rows, cols), 0) + (shape[0] if len(shape) == 3 else 1)
    stacks = []
    for (rows, cols), count in counts.items():
        for part in chunks(list(range(count)), rows * cols):
            stacks.append(torch.randn(len(part), rows, cols, device=device))
    testing_ops = torch.ops.dmuon_testing
    kernel = hasattr(testing_ops, "cuda_sym_kernel_usable") and bool(testing_ops.cuda_sym_kernel_usable(stacks[0], "float16"))
    try:
        return cuda_time_ms(orthogonalize_all(stacks, "cuda" if kernel else "cuda_dense"), warmup, iters,
                            host_ahead=True)
    finally:
        del stacks
        torch.cuda.empty_cache()
