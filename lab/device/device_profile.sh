#!/usr/bin/env bash
# One device call for a kernel question: build dmuon, time the symmetric kernel's
# configurations on the given shapes, and profile chosen kernels under Nsight Compute (full
# reports under $OUT, key lines printed).
# Usage (device tool; carry .cutlass):
#   bash lab/device/device_profile.sh [--multigpu] [--shapes "896x896x72c 3584x18944x7 …"]
#        [--ncu "CONFIG@SHAPE …"]
# SHAPE is MxKxB, with a trailing c for a β·C product; CONFIG is a symmetric-kernel
# configuration name (sm90:tmastore:s5:c0 …).
# --multigpu last runs the multigpu tests over NCCL when the machine has several GPUs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
MULTIGPU=0
SHAPES="896x896x72c 1536x1536x56c 896x4864x72 3584x18944x7"
NCU_OURS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --multigpu) MULTIGPU=1 ;;
    --shapes) SHAPES=$2; shift ;;
    --ncu) NCU_OURS=$2; shift ;;
    *) echo "unknown argument $1 (see the header of $0)"; exit 2 ;;
  esac
  shift
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# NOTE: the device library asks for --clock-control none (leave the clocks alone).
NCU_ARGS=(--clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats)

# NOTE: with the experimental instances (sym_kernel_bench.py --experimental below).
EXPERIMENTAL_KERNELS=1 source scripts/device_build.sh || exit 1

# 1. Times: our configurations (every one, experimental included).
timeout 240 python3 lab/kernels/sym_kernel_bench.py --experimental --shapes $SHAPES 2>&1 | tee "$OUT/sym_bench.log" \
  | grep -v "^  sm90" | tail -$(( 4 + $(echo $SHAPES | wc -w) ))

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
from dmuon._ops import testing_ops as ops
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
# 3. Last (it may be cut by the call's limit): the multigpu tests over NCCL, when there are
# GPUs for them.
NUM_GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$MULTIGPU" = 1 ] && [ "$NUM_GPUS" -ge 2 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m multigpu tests/python/test_multigpu.py 2>&1 \
    | tee "$OUT/pytest_multigpu.log" | tail -8
fi
echo "done"
