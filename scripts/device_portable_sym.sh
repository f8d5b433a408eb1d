#!/usr/bin/env bash
# One device call for the portable symmetric products: build, their GPU tests (forced on sm_90
# too; the autotuner's with AUTOTUNE_TESTS=1), then `dmuon bench sym` (the Gram products of each
# model by path: cuBLAS dense, lower blocks, row panels, sm_90a, each per shape as a ratio to
# cuBLAS; then the one-GPU step with each path forced); a short table last.
# Usage (through the device tool, .cutlass carried): bash scripts/device_portable_sym.sh [bench sym args…]
# (default: every model's products, the step of qwen2.5-0.5b and 1.5b with dense, blocks, panels).
# SKIP_TESTS=1 / SKIP_BENCH=1 leave a part out (two calls on one warm machine: the build is kept).
# Writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_build.sh || exit 1
SO=$(ls build/device/csrc/torch/_C*.so 2>/dev/null | head -1)
[ -n "$SO" ] && command -v cuobjdump >/dev/null && echo "SASS targets: $(cuobjdump --list-elf "$SO" | grep -o 'sm_[0-9a]*' | sort -u | tr '\n' ' ')"

# Autotuner results of this run only.
export DMUON_AUTOTUNE_CACHE=/tmp/dmuon_autotune_portable.txt
rm -f "$DMUON_AUTOTUNE_CACHE"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q tests/python/test_gpu_portable_sym.py 2>&1 \
    | tee "$OUT/pytest_portable.log" | tail -8
  if [ "${AUTOTUNE_TESTS:-0}" = 1 ]; then
    timeout 150 python3 -m pytest -q -x tests/python/test_gpu_autotune.py 2>&1 | tee "$OUT/pytest_autotune.log" | tail -3
  fi
fi
[ $# -eq 0 ] && set -- --step-model qwen2.5-0.5b qwen2.5-1.5b --paths dense blocks panels
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  DMUON_PRINT_CONFIGS=1 timeout ${BENCH_TIMEOUT:-300} python3 -m dmuon bench sym "$@" \
    2> "$OUT/bench_sym_configs.log" | tee "$OUT/bench_sym.log"
  grep -E "symmetric products|Error|error" "$OUT/bench_sym_configs.log" | sort | uniq -c | head -8
fi

echo "=== summary ==="
tail -qn1 "$OUT/pytest_portable.log" "$OUT/pytest_autotune.log" 2>/dev/null
grep -E "^model|sum over|DMUON_SYM_PATH=|failed:" "$OUT/bench_sym.log" 2>/dev/null
