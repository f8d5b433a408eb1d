#!/usr/bin/env bash
# The fake-world projection in one device call on ONE H200: build dmuon, then `bench step --fake-world` —
#   1. the check against the measured multi-GPU runs (BENCHMARKS.md "Distributed optimizer step"):
#      qwen2.5-7b and qwen2.5-1.5b, owner + gather + AdamW, every rank run (--ranks all), on
#      the topology of the 4-H200 host those runs used (one NVLink node): fake world 2 with
#      the depth-1 pipeline the world-2 runs were measured with, fake world 4 with today's
#      default pipeline and (7B, owner) with depth 1 too;
#   2. the projected scale table: D = 8, 16, 64, 256 for qwen2.5-7b and llama-3.1-8b on 8-GPU
#      nodes (NVLink inside, a 400 Gb/s-class NIC per GPU between nodes), rank 0 and the
#      planner's slowest rank; and HSDP once (D = 256 as 32 replicas of one node's sharding);
#   3. if time is left, the training step of Qwen2.5-1.5B at fake world 8 (bench e2e, dmuon vs AdamW);
# then the comparison with the measured figures and a short table last (summary.txt).
# Usage (device tool, kind nvidia-h200, carry [".cutlass"]): bash scripts/device_fake_world.sh [--budget S]
# Also runs on the CPU with a small manifest to check the script itself:
#   DEVICE=cpu SMOKE=1 bash scripts/device_fake_world.sh
# NOTE: the device tool brings back at most 8 files from $OUT: every JSON goes into one
# file (fake_world.json), the logs into run.log and build.log.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
START=$(date +%s)
BUDGET=560
DEVICE=${DEVICE:-cuda}
SMOKE=${SMOKE:-0}
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) BUDGET=$2; shift ;;
    *) echo "unknown argument $1 (see the header of $0)"; exit 2 ;;
  esac
  shift
done
source scripts/device_env.sh
WORK=$(mktemp -d /tmp/fake_world.XXXXXX)
LOG="$OUT/run.log"
: > "$LOG"

# Topologies (Gb/s per GPU and direction). NOTE: NVLink as NCCL achieves it, ~370 GB/s of
# the H200's 450 GB/s per direction (NCCL's maintainer, NVIDIA/nccl-tests#212; NV18 links);
# between nodes one 400 Gb/s ConnectX-7 per GPU at ~48.5 GB/s achieved (nccl-tests#267).
HOST4="--gpus-per-node 4 --intra-gbps 2960"
CLUSTER="--gpus-per-node 8 --intra-gbps 2960 --inter-gbps 388"

# Stage runner (scripts/stage_runner.sh). NOTE: 25 s of the budget stay for the comparison
# and the summary; every stage's output goes to run.log.
STAGES_TSV="$WORK/stages.tsv" STAGE_RESERVE=25 STAGE_MIN=20 STAGE_LOG=$LOG
: > "$STAGES_TSV"
source scripts/stage_runner.sh

# One bench step: name (the JSON's key), extra environment (or -), then bench step arguments.
step() {
  local name=$1 envs=$2 limit=$3
  shift 3
  local prefix=()
  [ "$envs" != "-" ] && prefix=(env "$envs")
  run_stage "$name" "$limit" "${prefix[@]}" python3 -m dmuon bench step --device "$DEVICE" "$@" \
    --json "$WORK/$name.json"
}

if [ "$DEVICE" = cuda ]; then
  t0=$(date +%s)
  source scripts/device_build.sh || { echo "BUILD FAILED"; exit 1; }
  printf 'build\tok\t%s\n' "$(( $(date +%s) - t0 ))" >> "$WORK/stages.tsv"
  # NOTE: NS autotuning and the planner's cost table are cached on disk, so the first run of
  # a shape pays for them and the later ranks, worlds and models of this call reuse them.
  export DMUON_AUTOTUNE_CACHE=/tmp/dmuon_autotune_fake.txt
fi

# Models and step counts. NOTE: from BENCHMARKS.md (H200): the 7B NS of every matrix takes
# ~440 ms, the 7B gather step ~625 ms, the 1.5B gather step ~90 ms. A fake rank's gather
# step is one GPU's full gather step, an owner step its share; warm-up 1 (the first step
# profiles, tunes and plans), 3 timed steps (2 in the scale table). Estimates per stage:
# 7B at world 4, every rank: 4 ranks x 4 steps x (0.63 + 0.25 + 0.03) s ~ 15 s, plus the
# process start (~10 s) and, the first time a model runs, its NS cost table and autotuning
# (~20-40 s); a scale stage (2 ranks, 3 steps each) ~20 s. In all: 5 check stages ~3 min,
# 10 scale stages ~3.5 min, the build before them.
BIG=qwen2.5-7b SMALL=qwen2.5-1.5b SCALE_MODELS=(qwen2.5-7b llama-3.1-8b) STEPS="--steps 3 --warmup 1"
SCALE_WORLDS="8 16 64 256" HSDP_WORLD=256 SCALE_STEPS="--steps 2 --warmup 1"
E2E_MODEL=qwen2.5-1.5b E2E_ARGS="--seq 4096 --micro-batch 5 --steps 2 --warmup 1"
if [ "$SMOKE" = 1 ]; then
  # The same stages on a CPU-sized model (a slice of 1.5B's matrices).
  BIG="qwen2.5-1.5b --max-matrices 3" SMALL="qwen2.5-0.5b --max-matrices 4"
  SCALE_MODELS=("qwen2.5-0.5b --max-matrices 4")
  SCALE_WORLDS="8 16" HSDP_WORLD=16
  STEPS="--steps 1 --warmup 0 --bucket-mb 1" SCALE_STEPS=$STEPS
  E2E_MODEL=tiny E2E_ARGS="--seq 32 --micro-batch 1 --steps 1 --warmup 0"
fi
key() { echo "$1" | cut -d' ' -f1; }

# 1. The check against the measured runs: one 4-GPU NVLink host. NOTE: world 2 was measured
# with the depth-1 pipeline only (BENCHMARKS.md), so it is run with that pipeline; world 4
# with today's default (depth 8) and, for 7B, depth 1 as well.
for model in "$BIG" "$SMALL"; do
  # shellcheck disable=SC2086
  step "step_$(key "$model")_w2_depth1" DMUON_PIPELINE_DEPTH=1 120 --model $model --fake-world 2 --ranks all \
    $HOST4 $STEPS
done
for model in "$BIG" "$SMALL"; do
  # shellcheck disable=SC2086
  step "step_$(key "$model")_w4" - 150 --model $model --fake-world 4 --ranks all $HOST4 $STEPS
done
# shellcheck disable=SC2086
step "step_$(key "$BIG")_w4_depth1" DMUON_PIPELINE_DEPTH=1 90 --model $BIG --fake-world 4 --ranks all --mode owner \
  $HOST4 $STEPS

# 2. The projected scale table on 8-GPU nodes. NOTE: under HSDP with one node's sharding the
# optimizer step runs inside that node's shard group of 8 and the replicas only repeat it,
# so one HSDP run (D = 256, 32 replicas) stands for every D >= 16.
for model in "${SCALE_MODELS[@]}"; do
  for world in $SCALE_WORLDS; do
    # shellcheck disable=SC2086
    step "step_$(key "$model")_w${world}" - 90 --model $model --fake-world $world --ranks slowest $CLUSTER \
      $SCALE_STEPS
  done
  # shellcheck disable=SC2086
  step "step_$(key "$model")_w${HSDP_WORLD}_hsdp" - 60 --model $model --fake-world $HSDP_WORLD \
    --hsdp $(( HSDP_WORLD / 8 )) --ranks slowest $CLUSTER $SCALE_STEPS
done

# 3. If time is left: the training step of Qwen2.5-1.5B at fake world 8 (one rank, FSDP2 and
# DMuon projected; micro-batch 5 of 4096 tokens, as the measured 4-GPU run), dmuon vs AdamW.
# NOTE: ~570 ms of forward + backward per step on an H200 (BENCHMARKS.md), 4 steps and one
# counting step per optimizer, the model built twice: ~60 s.
# shellcheck disable=SC2086
run_stage "e2e_$(key "$E2E_MODEL")_w8" 120 python3 -m dmuon bench e2e --device "$DEVICE" --model $E2E_MODEL \
  --fake-world 8 --optimizers dmuon,adamw $E2E_ARGS $CLUSTER --json "$WORK/e2e_$(key "$E2E_MODEL")_w8.json"

# Every JSON in one file, then the comparison and the tables.
python3 - "$WORK" "$OUT/fake_world.json" <<'PY'
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
records = {}
for path in sorted(work.glob("*.json")):
    try:
        records[path.stem] = json.loads(path.read_text())
    except ValueError as error:
        records[path.stem] = {"unreadable": str(error)}
stages = [line.split("\t") for line in (work / "stages.tsv").read_text().splitlines() if line]
out.write_text(json.dumps({"stages": stages, "records": records}, indent=1))
PY
cp "$WORK/stages.tsv" "$OUT/stages.tsv"
echo "total: $(( $(date +%s) - START )) s" | tee -a "$LOG"
python3 lab/reports/fake_compare.py "$OUT/fake_world.json" | tee "$OUT/summary.txt"
rm -rf "$WORK"
if cut -f2 "$OUT/stages.tsv" | grep -qv '^ok$'; then exit 1; fi
