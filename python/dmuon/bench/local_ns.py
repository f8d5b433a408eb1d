"""The one-GPU reference for a fake rank's Newton–Schulz (issue 26, item 5): the time the
local path takes to orthogonalize the same matrices a rank owns, measured in the same run.

The matrices are grouped by shape into batches of at most ``bench ns``'s chunk size (the
``NS only`` line of ``bench ns``, which uses the same op and batching), and each batch goes
through ``torch.ops.dmuon.orthogonalize`` with the tuned CUDA backend, timed with CUDA events.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


def local_ns_ms(shapes: list[tuple[int, ...]], device: str, warmup: int = 1, iters: int = 3) -> float:
    """Median milliseconds of one pass over every matrix of `shapes` ((rows, cols) or
    (batch, rows, cols)), orthogonalized in same-shape batches on one `device`."""
    from dmuon import _C
    from dmuon.bench.ns import chunks, cuda_time_ms

    if device != "cuda":
        raise ValueError(f"local_ns_ms measures the CUDA path; got device {device!r}")
    if not shapes:
        return 0.0
    coefficients, restarts = _C.default_schedule("gram", 5)
    flat = [x for c in coefficients for x in c]
    counts: dict[tuple[int, int], int] = OrderedDict()
    for shape in shapes:
        rows, cols = shape[-2:]
        counts[(rows, cols)] = counts.get((rows, cols), 0) + (shape[0] if len(shape) == 3 else 1)
    stacks = []
    for (rows, cols), count in counts.items():
        for part in chunks(list(range(count)), rows * cols):
            stacks.append(torch.randn(len(part), rows, cols, device=device))
    ops, testing_ops = torch.ops.dmuon, torch.ops.dmuon_testing
    kernel = hasattr(testing_ops, "cuda_sym_kernel_usable") and bool(testing_ops.cuda_sym_kernel_usable(stacks[0], "float16"))
    backend = "cuda" if kernel else "cuda_dense"

    def run():
        for s in stacks:
            ops.orthogonalize(s, "gram", flat, list(restarts), 1e-7, backend, "float16")

    try:
        return cuda_time_ms(run, warmup, iters, host_ahead=True)
    finally:
        del stacks
        torch.cuda.empty_cache()
