#!/usr/bin/env bash
# One device call comparing the current tree with a "before" tree, both built in it:
#   1. build the current tree and the before tree (carried as .old_tree: `git archive <commit>`
#      unpacked there) side by side, each installed into its own directory (no editable
#      install: the two must not shadow each other);
#   2. the one-GPU step (`bench ns`, DMuon.step and fused AdamW) for Qwen2.5-0.5B/1.5B/7B;
#   3. `bench step --fake-world W` for Qwen2.5-7B, W in $WORLDS (default "4 8"): the
#      planner's slowest rank's owner step, its NS against the same matrices on one GPU, peaks;
#   4. the weight-ownership mode's training step (`bench e2e --world 1 --model qwen2.5-1.5b`,
#      dmuon-ownership beside dmuon);
#   5. the host time of DMuon.step on one rank of fake world 64, Qwen2.5-7B, by phase
#      (lab/benches/fake_rank_host_profile.py of each tree);
#   6. (stage "backward", not in the default) the step begun from backward, on against off in
#      each tree (scripts/device_backward_step.sh; its CASES, STEPS and RUN_TIMEOUT apply);
# each before then after, then a short table last. STAGES picks (default "ns fake e2e host"),
# NS_MODELS the models of stage ns (default Qwen2.5-0.5B/1.5B/7B), NS_ROUNDS its rounds (1),
# NS_EXTRA more `bench ns` arguments (e.g. --profile: its kernel table lands in ns_<tree>.log),
# NS_TIMEOUT the seconds each tree's `bench ns` may take (150);
# OLD_TREE the before tree's folder (default .old_tree).
# Usage (device tool, carry [".cutlass", ".old_tree"]): bash scripts/device_engine_check.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
source scripts/device_env.sh
OLD_TREE=${OLD_TREE:-.old_tree}
[ -d "$OLD_TREE" ] || { echo "no $OLD_TREE (git archive <commit> | tar -x -C $OLD_TREE, then carry it)"; exit 2; }
ROOT=$PWD
cutlass=()
[ -d .cutlass/include ] && cutlass=(-Ccmake.define.DMUON_CUTLASS_DIR="$ROOT/.cutlass")
build() {  # tree, build dir, target
  CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install -q --no-build-isolation --no-deps --target "$3" "$1" \
    -Cbuild-dir="$2" -Ccmake.define.DMUON_BUILD_TESTS=OFF "${cutlass[@]}"
}
start=$(date +%s)
build "$ROOT" "$ROOT/build/engine_new" /tmp/site_new > "$OUT/build_new.log" 2>&1 & new_pid=$!
build "$ROOT/$OLD_TREE" "$ROOT/build/engine_old" /tmp/site_old > "$OUT/build_old.log" 2>&1 & old_pid=$!
wait $new_pid || { tail -30 "$OUT/build_new.log"; echo "BUILD (after) FAILED"; exit 1; }
wait $old_pid || { tail -30 "$OUT/build_old.log"; echo "BUILD (before) FAILED"; exit 1; }
echo "builds: $(( $(date +%s) - start )) s"
grep -h "CUTLASS" "$OUT"/build_*.log | head -2

run() {  # label (new|old), timeout, python3 args... (the tree's install on the path)
  local label=$1 limit=$2; shift 2
  # NOTE: a HOME per tree: the planner's cost table is cached under ~/.cache/dmuon, and the
  # first-step peak must include building it.
  mkdir -p /tmp/home_$label
  (cd /tmp && HOME=/tmp/home_$label PYTHONPATH=/tmp/site_$label DMUON_AUTOTUNE_CACHE=/tmp/autotune_$label.txt \
     timeout "$limit" python3 "$@")
}
STAGES=" ${STAGES:-ns fake e2e host} "
stage() { [[ "$STAGES" == *" $1 "* ]]; }
# NOTE: rounds interleave the trees (old, new, old, new): one tree's runs spread 1.5% apart.
models=()
for m in ${NS_MODELS:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do models+=(--model "$m"); done
stage ns && for round in $(seq "${NS_ROUNDS:-1}"); do
  for label in old new; do
    echo "== bench ns ($label, round $round)"
    run $label "${NS_TIMEOUT:-150}" -m dmuon bench ns "${models[@]}" --iters 5 --warmup 2 --skip-baselines --sym-shapes ${NS_EXTRA:-} 2>&1 |
      tee -a "$OUT/ns_$label.log" | grep -E "^model |^dmuon|^torch AdamW"
  done
done
stage fake && for label in old new; do
  for world in ${WORLDS:-4 8}; do
    echo "== bench step --fake-world $world ($label)"
    run $label 120 -m dmuon bench step --device cuda --model qwen2.5-7b --fake-world $world --gpus-per-node 8 \
      --intra-gbps 2960 --inter-gbps 388 --steps 3 --warmup 1 --json "$OUT/fake_${label}_w$world.json" \
      2>&1 | tee "$OUT/fake_${label}_w$world.log" | grep -E "^owner|^gather|^adamw|^NS of|^planner"
  done
done
if stage e2e; then
  for label in old new; do
    echo "== bench e2e --world 1, qwen2.5-1.5b ($label)"
    run $label 200 -m dmuon bench e2e --model qwen2.5-1.5b --world 1 --device cuda --optimizers dmuon-ownership,dmuon \
      --steps 5 --warmup 2 --seq 1024 --micro-batch 4 --json "$OUT/e2e_$label.json" 2>&1 | tee "$OUT/e2e_$label.log" | tail -12
  done
fi
if stage host; then
  for label in old new; do
    echo "== host time of DMuon.step, fake world 64, qwen2.5-7b ($label)"
    tree=$ROOT; [ $label = old ] && tree=$ROOT/$OLD_TREE
    run $label 200 "$tree/lab/benches/fake_rank_host_profile.py" --model qwen2.5-7b --world 64 --device cuda \
      --steps 10 2>&1 | tee "$OUT/host_$label.log" | tail -12
  done
fi
if stage backward; then
  for label in old new; do
    echo "== the step begun from backward ($label)"
    mkdir -p "$OUT/backward_$label"
    PYTHONPATH=/tmp/site_$label HOME=/tmp/home_$label OUT=$OUT/backward_$label bash scripts/device_backward_step.sh |
      tail -25
  done
fi
echo "=== summary ==="
for label in old new; do
  echo "-- one GPU ($label): step ms per model"
  grep -E "^model |^dmuon.DMuon.step|^torch AdamW" "$OUT/ns_$label.log" | cut -c1-110
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print("fake world, qwen2.5-7b, owner (ms; peak GB above the shards: steady / first steps)")
print(f"{'tree':<5} {'world':>5} {'rank':>5} {'step':>8} {'NS':>8} {'local NS':>9} {'ratio':>6} {'peak':>6} {'1st':>6}")
for label in ("old", "new"):
    for world in [int(w) for w in os.environ.get("WORLDS", "4 8").split()]:
        path = os.path.join(out, f"fake_{label}_w{world}.json")
        if not os.path.exists(path):
            print(f"{label:<5} {world:>5}  (no result)"); continue
        o = json.load(open(path))["methods"]["owner"]
        local = o.get("local_ns_ms")
        ratio = f"{o['ns_ms'] / local:6.2f}" if local else "     -"
        first = o.get("first_step_peak_extra_bytes", o["peak_extra_bytes"])
        print(f"{label:<5} {world:>5} {o['rank']:>5} {o['projected_step_ms']:8.1f} {o['ns_ms']:8.1f} "
              f"{(local or 0):9.1f} {ratio} {o['peak_extra_bytes'] / 1e9:6.1f} {first / 1e9:6.1f}")
PY
