"""The bench CLIs report bad input as argparse does: usage, "PROG: error: …", status 2, and
no traceback (as `python -m dmuon plan` and argparse's own checks already did)."""

from __future__ import annotations

import pytest

from dmuon.cli.main import cli


@pytest.mark.parametrize("argv, prog, message", [
    (["bench", "step", "--model", "nope"], "python -m dmuon bench step",
     "--model 'nope' is not a shipped manifest; choose one of"),
    (["bench", "step", "--model", "qwen2.5-0.5b", "--steps", "0"], "python -m dmuon bench step",
     "--steps must be >= 1, got 0"),
    (["bench", "step", "--model", "qwen2.5-0.5b", "--world", "two"], "python -m dmuon bench step",
     "--world must be 'auto' or a positive integer"),
    (["bench", "ns", "--model", "nope"], "python -m dmuon bench ns", "--model 'nope' is not a shipped manifest"),
    (["bench", "sym", "--step-model", "nope"], "python -m dmuon bench sym", "--model 'nope' is not a shipped manifest"),
    (["bench", "e2e", "--model", "tiny", "--micro-batch", "x"], "python -m dmuon bench e2e",
     "--micro-batch must be 'auto' or a positive integer, got 'x'"),
])
def test_bad_bench_arguments_are_usage_errors(argv, prog, message, capsys):
    """`python -m dmuon` runs cli(); main() raises the ValueError itself (for callers)."""
    with pytest.raises(SystemExit) as exit_info:
        cli(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(f"usage: {prog}") and f"{prog}: error: {message}" in err, err
    assert "Traceback" not in err
