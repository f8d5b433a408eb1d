#!/usr/bin/env bash
# One device call: build dmuon on the GPU machine, run the GPU tests (kernel tests
# included), optionally compute-sanitizer and the NS benchmark, print a short table last.
# Usage (through the device tool): bash scripts/device_check.sh [--sanitize] [--bench MODEL…]
# Carry .cutlass (the unpacked nvidia-cutlass headers) so the sm_90a kernel is built.
# Writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SANITIZE=0
MODELS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SANITIZE=1 ;;
    --bench) shift; while [ $# -gt 0 ] && [[ "$1" != --* ]]; do MODELS+=("$1"); shift; done; continue ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done

source scripts/device_env.sh
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
source scripts/device_build.sh || exit 1

# A C++ error raised through dmuon._C after CUDA is initialized must reach Python intact.
python3 -c "
import torch, dmuon._ops as o
torch.zeros(1, device='cuda')
try:
    o.testing_ops.orthogonalize(torch.randn(4, 4), 'gram', [1.0, 0.0, 0.0], [], 1e-7, 'nonsense')
except RuntimeError as e:
    print('C++ error reaches Python:', str(e).split(': ')[-1][:60])
" || echo "C++ ERROR PATH CRASHED"

# Autotuner results of this run only (never a stale cache from an earlier build).
export DMUON_AUTOTUNE_CACHE=/tmp/dmuon_autotune_device.txt
rm -f "$DMUON_AUTOTUNE_CACHE"

# GPU tests: the autotuner/graph tests first (every kernel configuration), then the kernel
# and NS tests, then every other gpu-marked test.
timeout 240 python3 -m pytest -q -x tests/python/test_gpu_autotune.py 2>&1 | tee "$OUT/pytest_autotune.log" | tail -6

# Benchmark (autotuned configs printed once per shape into the log), one table per model.
if [ ${#MODELS[@]} -gt 0 ]; then
  args=()
  for model in "${MODELS[@]}"; do args+=(--model "$model"); done
  DMUON_PRINT_CONFIGS=1 timeout ${BENCH_TIMEOUT:-300} python3 -m dmuon bench ns "${args[@]}" ${BENCH_ARGS:-} \
    2> "$OUT/bench_configs.log" | tee "$OUT/bench.log"
  grep -E "rejected|Error|error" "$OUT/bench_configs.log" | head -5
fi

timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x tests/python/test_gpu_ns_kernels.py 2>&1 | tee "$OUT/pytest_kernels.log" | tail -4
timeout 200 python3 -m pytest -q -m gpu tests/python --ignore tests/python/test_gpu_ns_kernels.py \
  --ignore tests/python/test_gpu_autotune.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -4

# Numerics: square fp16 Gram NS, restart after 2 vs after 2 and 4, vs standard iteration
# (DMUON_AUTOTUNE=0 keeps the Gram schedule on the Gram iteration).
DMUON_AUTOTUNE=0 DMUON_AUTOTUNE_CACHE=none timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/restarts.log"
import torch
from dmuon import _C
from dmuon._ops import testing_ops
from dmuon.reference import default_coefficients, newton_schulz_gram
c, _ = _C.default_schedule("gram", 5)
flat = [v for t in c for v in t]
torch.manual_seed(0)
print("square fp16 NS error vs fp64 (relative Frobenius, mean of 4 matrices): restarts [2] | [2,4] | standard iteration | fp64-ref-in-fp16")
for m, n in [(96, 96), (128, 128), (896, 896), (64, 200), (896, 4864)]:
    x = torch.randn(4, m, n, device="cuda", dtype=torch.float64)
    exact = torch.stack([newton_schulz_gram(g, default_coefficients("gram", 5), [2], 1e-7, torch.float64) for g in x])
    def err(out):
        return float(((out.double() - exact).flatten(1).norm(dim=1) / exact.flatten(1).norm(dim=1)).mean())
    r2 = testing_ops.orthogonalize(x.float(), "gram", flat, [2], 1e-7, "cuda", "float16")
    r24 = testing_ops.orthogonalize(x.float(), "gram", flat, [2, 4], 1e-7, "cuda", "float16")
    st = testing_ops.orthogonalize(x.float(), "standard", flat, [], 1e-7, "aten", "float16")  # NOTE: the CUDA backend iterates standard NS in bf16
    ref16 = torch.stack([newton_schulz_gram(g, default_coefficients("gram", 5), [2], 1e-7, torch.float16) for g in x.float()])
    print(f"{m}x{n}: {err(r2):.4f} | {err(r24):.4f} | {err(st):.4f} | {err(ref16):.4f}")
PY

# compute-sanitizer on every kernel: symmetric-kernel configurations, one NS run, the fused
# step (lab/kernels/sanitize_kernels.py, small shapes).
# NOTE: racecheck runs a part at a time: all three in one run went past 170 s (H200);
# with this environment the sym and ns parts took 20 s and the fused part 18 s
# (H200); memcheck of all three about 11 s.
if [ "$SANITIZE" = 1 ]; then
  DMUON_AUTOTUNE=0 DMUON_AUTOTUNE_CACHE=none timeout 200 compute-sanitizer --tool memcheck --print-limit 10 \
    python3 lab/kernels/sanitize_kernels.py 2>&1 | tail -3 | tee "$OUT/sanitize_memcheck.log"
  for part in sym ns fused; do
    DMUON_AUTOTUNE=0 DMUON_AUTOTUNE_CACHE=none timeout 300 compute-sanitizer --tool racecheck --print-limit 10 \
      python3 lab/kernels/sanitize_kernels.py $part 2>&1 | tail -3 | tee "$OUT/sanitize_racecheck_$part.log"
  done
fi

# The short table, last.
echo "=== summary ==="
tail -1 "$OUT/pytest_autotune.log"; tail -1 "$OUT/pytest_kernels.log"; tail -1 "$OUT/pytest_gpu.log"
for log in "$OUT"/sanitize_*.log; do
  [ -f "$log" ] && echo "$(basename "$log" .log): $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$log" || echo "no summary (cut by its timeout?)")"
done
grep -E "^X·Xᵀ" "$OUT/bench.log" 2>/dev/null | sed -E 's/(alternating rounds[^;]*);.*/\1/' | cut -c1-300
grep -E "^model |^dmuon|^torch|^plain|^NS only|^floor" "$OUT/bench.log" 2>/dev/null
