#!/usr/bin/env bash
# One device call: the one-GPU step's time and peak memory. Builds dmuon (scripts/device_build.sh),
# then bench ns over Qwen2.5-0.5B and -1.5B together (the table's last column, "peak+ GiB",
# is the allocator peak during the timed steps above what was held before), 1.5B alone (in
# one process the NS workspaces of an earlier model are not the later one's), and
# torch.cuda.memory_stats around single steps of the 1.5B step.
# Expected (tests/cpp/test_step_memory.cpp): the NS workspaces kept per stream, 1.77 GiB
# (0.5B) and 3.51 GiB (1.5B), plus the fp32 momentum made at the first step (1.33 and
# 4.88 GiB): peak+ about 3.10 and 8.39 GiB; the step no slower than before.
# Usage (through the device tool): bash scripts/device_peak.sh
# Carry .cutlass (the unpacked nvidia-cutlass headers) so the sm_90a kernel is built.
# Writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_build.sh || exit 1
export DMUON_AUTOTUNE_CACHE=/tmp/dmuon_autotune_peak.txt
rm -f "$DMUON_AUTOTUNE_CACHE"

# Both models in one process, as measured before (time and peak+ per model).
python3 -m dmuon bench ns --model qwen2.5-0.5b --model qwen2.5-1.5b --iters 5 --warmup 2 --skip-baselines \
  --sym-shapes 2>&1 | tee "$OUT/bench_ns.log" | grep -E "^model|^method|^dmuon|^torch AdamW|path:|out of memory|Error"
# 1.5B alone in a fresh process.
python3 -m dmuon bench ns --model qwen2.5-1.5b --iters 5 --warmup 2 --skip-baselines 2>&1 |
  tee "$OUT/bench_ns_15b.log" | grep -E "^model|^method|^dmuon|^torch AdamW|path:|out of memory|Error"

# The allocator around single steps: each warm-up step (tuning, captures, the second
# stream's first runs), then one replayed step.
python3 - <<'EOF' 2>&1 | tee "$OUT/memory_stats.log"
import torch
from dmuon.cli.bench.local_ns import local_dmuon, model_params, model_shapes

GiB = 2**30
torch.manual_seed(0)
opt = local_dmuon(model_params(model_shapes("qwen2.5-1.5b")))
keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
        "reserved_bytes.all.peak", "active_bytes.all.peak", "num_alloc_retries", "num_ooms")
for step in range(1, 7):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats()
    opt.step()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    peak_plus = (after["allocated_bytes.all.peak"] - before["allocated_bytes.all.current"]) / GiB
    held = (after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"]) / GiB
    print(f"step {step}: peak+ {peak_plus:.2f} GiB, held after {held:+.2f} GiB, "
          + ", ".join(f"{k} {after[k] / GiB:.2f} GiB" if "bytes" in k else f"{k} {after[k]}" for k in keys))
stats = opt.runtime.last_stats
print(f"last step: {stats.num_fused_batches} NS batches on {stats.num_fused_streams} streams")
EOF
