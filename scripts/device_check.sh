#!/usr/bin/env bash
# One device call: build dmuon on the GPU machine, run the GPU tests, print a short table.
# Usage (through the device tool): bash scripts/device_check.sh
# Writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/dmuon_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"

# Build (no GoogleTest or CBC on the GPU machine: the core tests and MILP are skipped there).
start=$(date +%s)
if ! python3 -m pip install -q --no-build-isolation --no-deps -e . -Cbuild-dir=build/device \
      -Ccmake.define.DMUON_BUILD_TESTS=OFF > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"

# GPU tests.
python3 -m pytest -q -m gpu tests/python 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
