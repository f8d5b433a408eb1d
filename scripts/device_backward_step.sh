#!/usr/bin/env bash
# One device call (one H100 or H200): what the step begun from backward costs and saves.
# Builds dmuon, then runs each case of $CASES: a model's training step on the fake rank of
# world D, the optimizers in turns, backward_step on or off for "dmuon" ("dmuon-backward" is
# always on), optionally with one profiled step per optimizer (--profile: torch.profiler's
# device timeline and DMuon's host ranges, the hooks' `backward_step.params_final` among
# them). Prints a short table last: per optimizer the forward + backward, what is left after
# backward and the step against AdamW, then on against off (within a run where both ran).
# Default: Qwen2.5-1.5B at fake worlds 8 and 64, micro-batch 1, AdamW, DMuon and DMuon begun
# from backward in turns in one run each (profiled).
# Usage (through the device tool; carry .cutlass): bash scripts/device_backward_step.sh
# Environment: CASES (whitespace-separated MODEL:D:on|off:ORDER[:profile]; default below; a
# case given again is a further round, its record named _r2, ...),
# SEQ (4096), STEPS (5), RUN_TIMEOUT (s per run, 150), TIMING_AB (0; 1: one more 1.5B run at
# fake 64 with DMUON_PROFILE=1, the phases synchronized as before device marks),
# HOST_PROFILE (MODEL:D[:NARROW], e.g. qwen2.5-7b:64: then DMuon's host time by phase on
# that fake rank, lab/benches/fake_rank_host_profile.py, widths divided by NARROW);
# a CPU smoke run: CASES="tiny:4:off:adamw,dmuon,dmuon-backward" SEQ=16 STEPS=1 TIMING_AB=0 \
#   HOST_PROFILE=qwen2.5-0.5b:4:32 bash scripts/device_backward_step.sh
# NOTE: the build order matters on its own (docs/benchmarks/history.md, "Sections moved
# out": the model built first ran 15 ms slower in one run): AdamW's model is built first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
# NOTE: off is profiled too: what step() costs with the option on against off is read phase by
# phase (take, engine, inputs, AdamW part), not from the totals alone.
# NOTE: on and off run in one process, in turns ("dmuon-backward" beside "dmuon" under
# --backward-step off): measured on one H100, AdamW's own forward + backward moved
# 197-264 ms between runs of one call, more than on and off differ.
DEFAULT_CASES="qwen2.5-1.5b:64:off:adamw,dmuon,dmuon-backward:profile qwen2.5-1.5b:8:off:adamw,dmuon,dmuon-backward:profile"
CASES=${CASES:-$DEFAULT_CASES}
STEPS=${STEPS:-5}
SEQ=${SEQ:-4096}
python3 -c "import dmuon._C" 2>/dev/null || source scripts/device_build.sh || exit 1

runs=()
run_case() {  # name, model, D, mode, order, extra args...
  local name=$1 model=$2 world=$3 mode=$4 order=$5
  shift 5
  timeout "${RUN_TIMEOUT:-150}" python3 -m dmuon bench e2e --model "$model" --seq "$SEQ" --micro-batch 1 \
    --warmup 2 --steps "$STEPS" --fake-world "$world" --backward-step "$mode" --optimizers "$order" \
    "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 || echo "$name: exit $?"
  grep -E "^profile of one|^ bench\.|device timeline|^    gap " "$OUT/$name.log" | head -30
  runs+=("$name")
}
for c in $CASES; do
  IFS=: read -r model world mode order profile <<< "$c"
  extra=()
  [ "${profile:-}" = profile ] && extra=(--profile)
  # NOTE: a case given again is a second round, its record named _r2 (_r3, ...).
  name="${model}_${world}_${mode}_${order//,/_}"
  round=1
  while [[ " ${runs[*]:-} " == *" $name$([ $round -gt 1 ] && echo _r$round) "* ]]; do round=$((round + 1)); done
  [ $round -gt 1 ] && name+="_r$round"
  run_case "$name" "$model" "$world" "$mode" "$order" "${extra[@]}"
done
if [ "${TIMING_AB:-0}" = 1 ]; then
  DMUON_PROFILE=1 run_case "qwen2.5-1.5b_64_on_adamw_dmuon_synced" qwen2.5-1.5b 64 on adamw,dmuon
fi

if [ -n "${HOST_PROFILE:-}" ]; then
  IFS=: read -r model world narrow <<< "$HOST_PROFILE"
  timeout "${RUN_TIMEOUT:-150}" python3 lab/benches/fake_rank_host_profile.py --model "$model" --world "$world" \
    --narrow "${narrow:-1}" --steps 20 > "$OUT/host_profile_${model}_${world}.log" 2>&1 || echo "host profile: exit $?"
  tail -2 "$OUT/host_profile_${model}_${world}.log"
fi

echo "=== summary (fake worlds, optimizers in turns, seq $SEQ) ==="
python3 - "$OUT" "${runs[@]}" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'run':<50} {'dmuon fwd+bwd':>14} {'adamw fwd+bwd':>14} {'dmuon left':>11} {'adamw opt':>10} {'left/AdamW':>11} "
      f"{'NS in bwd':>10} {'vs AdamW':>9}")
for name in sys.argv[2:]:
    path = out / f"{name}.json"
    if not path.exists():
        print(f"{name:<50} (no record)")
        continue
    o = json.loads(path.read_text())["optimizers"]
    a = o["adamw"]
    for key in ("dmuon", "dmuon-backward"):
        if key not in o:
            continue
        d = o[key]
        share = d["muon"].get("early_share") if d["muon"] else None
        versus = (d["projected_step_ms"] - a["projected_step_ms"]) / a["projected_step_ms"] * 100
        label = name if key == "dmuon" else f"{name} (on)"
        print(f"{label:<50} {d['fwd_bwd_ms']:14.1f} {a['fwd_bwd_ms']:14.1f} {d['opt_left_after_backward_ms']:11.1f} "
              f"{a['opt_ms']:10.1f} {d['opt_left_after_backward_ms'] / a['opt_ms']:10.2f}x "
              f"{('%.0f%%' % (share * 100)) if d['backward_step'] and share is not None else '-':>10} "
              f"{versus:+8.2f}%")

# On against off, per run where both ran in turns (dmuon-backward beside dmuon), else per
# (model, D, round) across runs: the figures of the issue's targets (forward + backward within
# 2% of off, less left after backward than off).
rows = {}
for name in sys.argv[2:]:
    path = out / f"{name}.json"
    if not path.exists():
        continue
    o = json.loads(path.read_text())["optimizers"]
    model, world, mode = name.split("_")[:3]
    if "dmuon-backward" in o and "dmuon" in o and not o["dmuon"]["backward_step"]:
        rows[(model, world, name)] = {"on": o["dmuon-backward"], "off": o["dmuon"]}
        continue
    last = name.split("_")[-1]
    round_ = last[1:] if last[:1] == "r" and last[1:].isdigit() else "1"
    rows.setdefault((model, world, "round " + round_), {})[mode] = o["dmuon"]
print(f"\n{'model':<14} {'D':>3} {'where':<40} {'fwd+bwd on/off ms':>20} {'on vs off':>10} {'left on/off ms':>16} "
      f"{'step on/off ms':>16} {'NS in bwd':>10}")
for (model, world, where), r in rows.items():
    if "on" not in r or "off" not in r:
        continue
    on, off = r["on"], r["off"]
    share = on["muon"].get("early_share") if on["muon"] else None
    print(f"{model:<14} {world:>3} {where:<40} {on['fwd_bwd_ms']:9.1f}/{off['fwd_bwd_ms']:<9.1f} "
          f"{(on['fwd_bwd_ms'] - off['fwd_bwd_ms']) / off['fwd_bwd_ms'] * 100:+9.2f}% "
          f"{on['opt_left_after_backward_ms']:7.1f}/{off['opt_left_after_backward_ms']:<7.1f} "
          f"{on['projected_step_ms']:7.1f}/{off['projected_step_ms']:<7.1f} "
          f"{('%.0f%%' % (share * 100)) if share is not None else '-':>10}")
PY
