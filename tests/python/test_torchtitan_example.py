"""examples/torchtitan_style.py: a Llama-style MoE model parallelized as torchtitan does
(TP colwise/rowwise, EP of the experts, FSDP2) trains with DMuon on 4 Gloo processes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchtitan_style.py"


@pytest.mark.slow
def test_torchtitan_style_example_trains():
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "12"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    match = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+) .* (\d+) matrices orthogonalized", done.stdout)
    assert match, done.stdout
    first, last, matrices = float(match[1]), float(match[2]), int(match[3])
    assert last < first - 0.5, (first, last)
    # Per block: q, k, v, o, gate, up, down, the router, and 2 stacks of 4 experts; 2 blocks;
    # each once over all ranks.
    assert matrices == 2 * (8 + 2 * 4), done.stdout
