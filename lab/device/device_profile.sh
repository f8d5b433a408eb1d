#!/usr/bin/env bash
# One device call for a kernel question: build dmuon, time the symmetric kernel's
# configurations and CUTLASS's own dense tiles on the same shapes, and profile chosen kernels
# under Nsight Compute (full reports under $OUT, key lines printed).
# Usage (device tool; carry .cutlass, and build/probe to skip the probe's 3-minute build):
#   bash lab/device/device_profile.sh [--multigpu] [--shapes "896x896x72c 3584x18944x7 …"]
#        [--ncu "CONFIG@SHAPE …"] [--ncu-cutlass "SHAPE …"]
# SHAPE is MxKxB, with a trailing c for a β·C product (CUTLASS's probe times X·Xᵀ only, so
# it skips those); CONFIG is a symmetric-kernel configuration name (sm90:tmastore:s5:c0 …).
# --multigpu last runs the multigpu tests over NCCL when the machine has several GPUs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT=${OUT:-/tmp/dmuon_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

MULTIGPU=0
SHAPES="896x896x72c 1536x1536x56c 896x4864x72 3584x18944x7"
NCU_OURS=""
NCU_CUTLASS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --multigpu) MULTIGPU=1 ;;
    --shapes) SHAPES=$2; shift ;;
    --ncu) NCU_OURS=$2; shift ;;
    --ncu-cutlass) NCU_CUTLASS=$2; shift ;;
    *) echo "unknown argument $1 (see the header of $0)"; exit 2 ;;
  esac
  shift
done
PROBE=build/probe/cutlass_tile_probe
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# NOTE: the device library asks for --clock-control none (leave the clocks alone).
NCU_ARGS=(--clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats)

nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
# NOTE: with the experimental instances (sym_kernel_bench.py --experimental below).
EXPERIMENTAL_KERNELS=1 source scripts/device_build.sh || exit 1
if [ ! -x "$PROBE" ]; then
  t0=$(date +%s)
  mkdir -p build/probe
  nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I.cutlass/include \
    -lcublasLt -lcublas -o "$PROBE" lab/kernels/cutlass_tile_probe.cu > "$OUT/probe_build.log" 2>&1 \
    || { tail -20 "$OUT/probe_build.log"; echo "PROBE BUILD FAILED"; }
  echo "probe build: $(( $(date +%s) - t0 )) s"
fi

# 1. Times: our configurations (every one, experimental included) and CUTLASS's tiles.
timeout 240 python3 lab/kernels/sym_kernel_bench.py --experimental --shapes $SHAPES 2>&1 | tee "$OUT/sym_bench.log" \
  | grep -v "^  sm90" | tail -$(( 4 + $(echo $SHAPES | wc -w) ))
DENSE=$(for s in $SHAPES; do [[ "$s" == *c ]] || echo "$s"; done)
if [ -x "$PROBE" ] && [ -n "$DENSE" ]; then
  timeout 180 "$PROBE" --iters 20 $DENSE > "$OUT/probe.log" 2>&1
  sed -n '/==== summary/,/==== cuBLASLt/p' "$OUT/probe.log"
fi

# 2. Nsight Compute: one launch of each named kernel (after a warm-up launch).
key_lines() {
  grep -E "^  [a-zA-Z_:<]|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Active Warps Per|stall|Stall|Executed Ipc A|Registers" "$1" \
    | grep -v -E "^    ---|^  Section" | cut -c1-200 | head -60
}
for item in $NCU_OURS; do
  config=${item%@*}
  shape=${item#*@}
  tag=$(echo "$item" | tr ':@' '__')
  timeout 180 "$NCU" "${NCU_ARGS[@]}" --kernel-name regex:sym_product_kernel --launch-skip 1 --launch-count 1 \
    python3 -c "
import math, sys, torch
from dmuon._ops import ops
config, shape = sys.argv[1], sys.argv[2]
with_c = shape.endswith('c')
m, k, b = (int(v) for v in shape.rstrip('c').split('x'))
a = (torch.randn(b, m, k, device='cuda') / math.sqrt(k)).half()
bb = a if not with_c else (torch.randn(b, m, k, device='cuda') / math.sqrt(k)).half()
c = None
if with_c:
    c = torch.randn(b, m, m, device='cuda').half()
    c = c + c.transpose(1, 2)
for _ in range(2):
    ops.cuda_sym_product_config(a, bb, c, 0.75 if with_c else 1.0, -0.5 if with_c else 0.0, config)
torch.cuda.synchronize()
" "$config" "$shape" > "$OUT/ncu_$tag.txt" 2>&1
  echo "== ncu $item"
  key_lines "$OUT/ncu_$tag.txt"
done
for shape in $NCU_CUTLASS; do
  # NOTE: the probe's instances run in a fixed order (its main()): one check launch and one
  # timed launch each with --warmup 0 --iters 1; the cuBLASLt reference comes first.
  timeout 240 "$NCU" "${NCU_ARGS[@]}" --kernel-name regex:device_kernel --launch-count 24 \
    "$PROBE" --warmup 0 --iters 1 "$shape" > "$OUT/ncu_cutlass_$shape.txt" 2>&1
  echo "== ncu CUTLASS $shape"
  key_lines "$OUT/ncu_cutlass_$shape.txt"
done
# 3. Last (it may be cut by the call's limit): the multigpu tests over NCCL, when there are
# GPUs for them.
NUM_GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$MULTIGPU" = 1 ] && [ "$NUM_GPUS" -ge 2 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m multigpu tests/python/test_multigpu.py 2>&1 \
    | tee "$OUT/pytest_multigpu.log" | tail -8
fi
echo "done"
