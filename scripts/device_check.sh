#!/usr/bin/env bash
# One device call: build dmuon on the GPU machine, run the GPU tests (kernel tests
# included), optionally compute-sanitizer and the NS benchmark, print a short table last.
# Usage (through the device tool): bash scripts/device_check.sh [--sanitize] [--bench MODEL…]
# Carry .cutlass (the unpacked nvidia-cutlass headers) so the sm_90a kernel is built.
# Writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/dmuon_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
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

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"

source scripts/device_build.sh || exit 1

# A C++ error raised through dmuon._C after CUDA is initialized must reach Python intact.
python3 -c "
import torch, dmuon._ops as o
torch.zeros(1, device='cuda')
try:
    o.ops.orthogonalize(torch.randn(4, 4), 'gram', [1.0, 0.0, 0.0], [], 1e-7, 'nonsense')
except RuntimeError as e:
    print('C++ error reaches Python:', str(e).split(': ')[-1][:60])
" || echo "C++ ERROR PATH CRASHED"

# GPU tests (the kernel tests first, then every gpu-marked test).
timeout 420 python3 -m pytest -q -x tests/python/test_gpu_ns_kernels.py 2>&1 | tee "$OUT/pytest_kernels.log" | tail -15
timeout 300 python3 -m pytest -q -m gpu tests/python --ignore tests/python/test_gpu_ns_kernels.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -8

# compute-sanitizer on the symmetric kernel and one NS run (small shapes).
if [ "$SANITIZE" = 1 ]; then
  cat > /tmp/dmuon_sanitize.py <<'PY'
import torch, dmuon
from dmuon._ops import ops
x = (torch.randn(3, 203, 333, device="cuda") / 20).half()
ld = 336
xp = torch.zeros(3, 203, ld, device="cuda", dtype=torch.half)[..., :333]; xp.copy_(x)
d = ops.cuda_sym_product(xp, xp, None, 1.0, 0.0, True)
c, r = dmuon._C.default_schedule("gram", 5)
out = ops.orthogonalize(torch.randn(2, 130, 300, device="cuda"), "gram", [v for t in c for v in t], list(r), 1e-7, "cuda", "float16")
torch.cuda.synchronize(); print("sanitize script ok", bool(torch.isfinite(out).all()))
PY
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --print-limit 10 \
      python3 /tmp/dmuon_sanitize.py 2>&1 | tail -4 | tee "$OUT/sanitize_$tool.log"
  done
fi

# Benchmark: one table per model, printed last.
for model in "${MODELS[@]}"; do
  timeout 300 python3 -m dmuon bench ns --model "$model" 2>&1 | tee "$OUT/bench_$model.log"
done
# The full optimizer (its step runtime included), separately: a failure there keeps the tables above.
if [ ${#MODELS[@]} -gt 0 ]; then
  timeout 200 python3 -m dmuon bench ns --model "${MODELS[0]}" --dmuon-optimizer --iters 5 --sym-shapes 2>&1 \
    | grep -E "DMuon|dmuon NS|torch.optim.Muon|Error|error" | tee "$OUT/bench_dmuon_optimizer.log"
fi
