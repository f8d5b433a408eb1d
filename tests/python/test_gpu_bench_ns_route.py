"""`python -m dmuon bench ns --ungated` times the path it names (marker gpu): each timed DMuon
runtime reports its route, and the ungated timing's runtime has the gated step off even with
DMUON_GATED_STEP=1 in the environment (the bench sets Execution options, not variables; a
process-wide cache of the variable once made both timings take the gated path)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bench ns needs a CUDA GPU")
def test_bench_ns_ungated_reports_the_ungated_route():
    env = {**os.environ, "DMUON_GATED_STEP": "1"}
    out = subprocess.run([sys.executable, "-m", "dmuon", "bench", "ns", "--model", "qwen2.5-0.5b", "--iters", "2",
                          "--warmup", "1", "--skip-baselines", "--ungated"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    # Each timing line "  <name>: <ms> ms" is followed by its runtime's "    path: gated step on|off, …".
    routes = dict(re.findall(r"^  (dmuon\.DMuon\.step[^\n]*?): [0-9.nan]+ ms\n    path: gated step (on|off)",
                             out.stdout, flags=re.M))
    assert routes.get("dmuon.DMuon.step (gated_step=False)") == "off", out.stdout[-3000:]
    assert routes.get("dmuon.DMuon.step (bucket 64 MiB)") == "on", out.stdout[-3000:]
