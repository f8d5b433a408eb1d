#!/usr/bin/env bash
# One device call (one H200): where the step begun from backward spends its time (issue 27).
# Builds dmuon, then for each fake world D in $WORLDS (default "64 8") runs Qwen2.5-1.5B's
# training step with the optimizers in turns, backward_step on and off, each with both build
# orders (adamw first, dmuon first), and one profiled step per optimizer (--profile) in the
# "on, adamw first" run. Prints a short table last: per run the forward + backward, what is
# left after backward and the step against AdamW.
# Usage (through the device tool; carry .cutlass): bash scripts/device_backward_step.sh
# Environment: WORLDS, MODEL (default qwen2.5-1.5b), SEQ (4096), STEPS (5), RUN_TIMEOUT (s per run, 100);
# a CPU smoke run: MODEL=tiny SEQ=16 WORLDS=4 STEPS=1 bash scripts/device_backward_step.sh
# NOTE: the build order matters on its own (BENCHMARKS.md, "The step begun from backward,
# optimizers in turns": the model built first ran 15 ms slower in one run): each setting
# runs with both orders.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/dmuon_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
WORLDS=${WORLDS:-"64 8"}
MODEL=${MODEL:-qwen2.5-1.5b}
STEPS=${STEPS:-5}
SEQ=${SEQ:-4096}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import dmuon._C" 2>/dev/null || source scripts/device_build.sh || exit 1

runs=()
for D in $WORLDS; do
  for mode in on off; do
    for order in adamw,dmuon dmuon,adamw; do
      name="e2e_${D}_${mode}_${order/,/_}"
      extra=()
      [ "$mode" = on ] && [ "$order" = adamw,dmuon ] && extra=(--profile)
      timeout "${RUN_TIMEOUT:-100}" python3 -m dmuon bench e2e --model "$MODEL" --seq "$SEQ" --micro-batch 1 \
        --warmup 2 --steps "$STEPS" --fake-world "$D" --backward-step "$mode" --optimizers "$order" \
        "${extra[@]}" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 || echo "$name: exit $?"
      grep -E "^profile of one|^ bench\.|device timeline|^    gap " "$OUT/$name.log" | head -30
      runs+=("$name")
    done
  done
done

echo "=== summary ($MODEL, fake worlds $WORLDS, optimizers in turns) ==="
python3 - "$OUT" "${runs[@]}" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'run':<28} {'dmuon fwd+bwd':>14} {'adamw fwd+bwd':>14} {'dmuon left':>11} {'adamw opt':>10} {'NS in bwd':>10} {'vs AdamW':>9}")
for name in sys.argv[2:]:
    path = out / f"{name}.json"
    if not path.exists():
        print(f"{name:<28} (no record)")
        continue
    o = json.loads(path.read_text())["optimizers"]
    d, a = o["dmuon"], o["adamw"]
    share = d["muon"].get("early_share") if d["muon"] else None
    versus = (d["projected_step_ms"] - a["projected_step_ms"]) / a["projected_step_ms"] * 100
    print(f"{name:<28} {d['fwd_bwd_ms']:14.1f} {a['fwd_bwd_ms']:14.1f} {d['opt_left_after_backward_ms']:11.1f} "
          f"{a['opt_ms']:10.1f} {('%.0f%%' % (share * 100)) if d['backward_step'] and share is not None else '-':>10} "
          f"{versus:+8.2f}%")
PY
