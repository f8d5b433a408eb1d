"""Loads dmuon._C (which registers the test and bench ops torch.ops.dmuon_testing.*) with
an actionable error."""

from __future__ import annotations

import torch  # first: torch's libraries must be loaded before dmuon._C

_BUILD_HINT = "Build it with `pip install --no-build-isolation -e .` (or run `bash scripts/run.sh test`)."
_TORCH_RELEASE = ".".join(torch.__version__.split(".")[:2])

try:
    from dmuon import _C  # noqa: F401
except ImportError as error:  # pragma: no cover - only on a broken install
    raise ImportError(
        f"dmuon's C++ extension dmuon._C cannot be loaded ({error}): it is not built, or it was built "
        f"against another torch release than the installed {torch.__version__}. {_BUILD_HINT}"
    ) from error

# NOTE: torch's C++ ABI changes between releases: a dmuon._C compiled against another
# release's headers may load and then fail inside a call.
if _C.torch_version != _TORCH_RELEASE:  # pragma: no cover - only on a stale build
    raise ImportError(
        f"dmuon._C was built against torch {_C.torch_version}, but torch {torch.__version__} is "
        f"imported. {_BUILD_HINT}"
    )

testing_ops = torch.ops.dmuon_testing
