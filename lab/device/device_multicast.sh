#!/usr/bin/env bash
# One device call: the first GPU run of the DRAFT 2-CTA cluster configurations of the sm_90a
# symmetric kernel ("sm90:mc2-…", TMA multicast; csrc/ns/cuda/sm90_sym_kernel.cuh): build,
# a smoke run under a short timeout (a barrier-protocol deadlock hangs there first), the
# config tests in a build with every experimental instance, compute-sanitizer memcheck and racecheck at
# small shapes, and the timing against the existing configurations and cuBLAS on the shapes
# of lab/kernels/sym_kernel_bench.py; a short table last. Budget: under 6 minutes.
# Usage (through the device tool, carry .cutlass): bash lab/device/device_multicast.sh
# Writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/dmuon_out}
mkdir -p "$OUT"
# NOTE: EXPERIMENTAL_KERNELS=1 builds with -DDMUON_EXPERIMENTAL_KERNELS=ON: every mc2 configuration a candidate (ops.cuda_sym_configs(),
# the config tests); autotuning off so that no step tunes (or caches) anything on the side.
export PYTHONUNBUFFERED=1 EXPERIMENTAL_KERNELS=1 DMUON_AUTOTUNE=0 DMUON_AUTOTUNE_CACHE=none
start_all=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
source scripts/device_build.sh || exit 1
SO=$(ls build/device/csrc/torch/_C*.so 2>/dev/null | head -1)
if [ -n "$SO" ] && command -v cuobjdump >/dev/null; then
  echo "SASS: $(cuobjdump -sass "$SO" 2>/dev/null | grep -c 'UTMALDG.*MULTICAST') multicast TMA loads"
fi

# 1. Smoke: every mc2 configuration once per pair kind (R=1: shadow; R=2, batch 3: separate
# and shadow; R=3: column and row pairs), 60 s at most; a hang prints SMOKE HUNG.
cat > "$OUT/mc2_runs.py" <<'PY'
"""Small runs of the mc2 configurations (smoke test and compute-sanitizer target)."""
import math
import sys

import torch

from dmuon._ops import ops

CONFIGS = ["sm90:mc2-tmastore:s4:c0", "sm90:mc2-tmastore:s5:c0", "sm90:mc2-staged:s6:c0", "sm90:mc2-tmastore:s4:c2"]
torch.manual_seed(0)
worst = 0.0
for batch, m, k in [(1, 100, 70), (3, 203, 333), (2, 383, 200)]:
    ld, ldm = (k + 7) // 8 * 8, (m + 7) // 8 * 8
    a = torch.zeros(batch, m, ld, device="cuda", dtype=torch.half)[..., :k]
    a.copy_(torch.randn(batch, m, k, device="cuda") / math.sqrt(k))
    c = torch.zeros(batch, m, ldm, device="cuda", dtype=torch.half)[..., :m]
    c0 = torch.randn(batch, m, m, device="cuda")
    c.copy_(c0 + c0.transpose(1, 2))
    exact = 0.5 * a.double() @ a.double().transpose(1, 2) - 0.25 * c.double()
    for config in CONFIGS:
        for cc, alpha, beta in [(None, 1.0, 0.0), (c, 0.5, -0.25)]:
            d = ops.cuda_sym_product_config(a, a, cc, alpha, beta, config)
            torch.cuda.synchronize()
            if cc is not None:
                worst = max(worst, float((d.double() - exact).norm() / exact.norm()))
            print(f"{config} {batch}x{m}x{k} {'+C' if cc is not None else ''}: finite {bool(torch.isfinite(d).all())}, "
                  f"symmetric {bool(torch.equal(d, d.transpose(1, 2)))}", file=sys.stderr)
print(f"mc2 runs ok, worst relative error of the +C runs {worst:.2e}")
PY
timeout 60 python3 "$OUT/mc2_runs.py" > "$OUT/smoke.log" 2>&1
smoke=$?
if [ "$smoke" = 124 ]; then echo "SMOKE HUNG (timeout): see $OUT/smoke.log for the last finished run"; fi
tail -3 "$OUT/smoke.log"

# 2. Tests: the mc2 tests and every-config test (which now includes the mc2 configurations).
if [ "$smoke" = 0 ]; then
  timeout 150 python3 -m pytest -q -x tests/python/test_gpu_autotune.py -k "cluster or every_sym_config" \
    2>&1 | tee "$OUT/pytest_mc2.log" | tail -6
fi

# 3. compute-sanitizer on the small runs.
if [ "$smoke" = 0 ]; then
  for tool in memcheck racecheck; do
    timeout 75 compute-sanitizer --tool $tool --print-limit 10 python3 "$OUT/mc2_runs.py" 2>/dev/null \
      > "$OUT/sanitize_$tool.log"
    echo "$tool (rc $?): $(tail -1 "$OUT/sanitize_$tool.log")"
  done
fi

# 4. Timing: the existing configurations ("old") against mc2 ("new") and cuBLAS.
if [ "$smoke" = 0 ]; then
  timeout 150 python3 lab/kernels/sym_kernel_bench.py --experimental > "$OUT/bench_mc2.log" 2>&1
  echo "bench (rc $?): $(grep -c ' +C\|: ' "$OUT/bench_mc2.log") lines, $OUT/bench_mc2.log"
fi

# The short table, last.
echo "=== summary ($(( $(date +%s) - start_all )) s) ==="
echo "smoke: rc $smoke ($(tail -1 "$OUT/smoke.log"))"
tail -1 "$OUT/pytest_mc2.log" 2>/dev/null
for tool in memcheck racecheck; do [ -f "$OUT/sanitize_$tool.log" ] && echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"; done
sed -n '/^ *shape /,/^$/p' "$OUT/bench_mc2.log" 2>/dev/null
