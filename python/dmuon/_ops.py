"""Loads dmuon._C (which registers torch.ops.dmuon.* and, in CUDA builds, the test and
bench ops torch.ops.dmuon_testing.*) with an actionable error."""

from __future__ import annotations

import torch  # noqa: F401  (torch's libraries must be loaded before dmuon._C)

try:
    from dmuon import _C  # noqa: F401
except ImportError as error:  # pragma: no cover - only on a broken install
    raise ImportError(
        "dmuon's C++ extension dmuon._C is not built. Install the package with "
        "`pip install --no-build-isolation -e .` (or run `bash scripts/run.sh test`)."
    ) from error

ops = torch.ops.dmuon
testing_ops = torch.ops.dmuon_testing
