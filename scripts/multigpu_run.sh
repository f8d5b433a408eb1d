#!/usr/bin/env bash
# The several-GPU run in one device call: build dmuon, check it over NCCL, time the
# optimizer step at every world size, time the training step, check the fake-world
# projection against what was measured in the same call; a short summary table last.
# Usage (device tool; carry [".cutlass"] so the sm_90a kernel is built; kind nvidia-h200-x2,
# -x4 or -x8 — the world sizes follow the GPUs present):
#   bash scripts/multigpu_run.sh [--stages test,step,e2e,e2e7b,project,e2e1] [--worlds 2,4,8]
#        [--step-models qwen2.5-1.5b,qwen2.5-7b] [--e2e-model qwen2.5-1.5b]
#        [--e2e-optimizers dmuon,dmuon-ownership,adamw] [--e2e-micro-batch N|auto]
#        [--budget SECONDS]
# Stages: test (pytest -m multigpu: every mode, the step begun inside backward, NaN/Inf
# agreement, mismatched parameters), step (bench step --worlds), e2e (bench e2e on every
# GPU; dmuon's step begins inside backward at world > 1), e2e7b (Qwen2.5-7B at world 8,
# where 8 GPUs are present), project (bench step / e2e --fake-world at the same worlds,
# then python3 lab/reports/projection_check.py), e2e1 (one GPU).
# --worlds 1 is the dry run on one GPU (NCCL with one rank: no transfers, every code path).
# Every stage runs under `timeout`, clipped to what is left of the budget (default 540 s,
# the build included), so one hang cannot eat the call; logs and JSON go to $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
START=$(date +%s)

# Arguments.
STAGES=test,step,e2e,e2e7b,project
WORLDS_WANTED=2,4,8
STEP_MODELS=qwen2.5-1.5b,qwen2.5-7b
E2E_MODEL=qwen2.5-1.5b
E2E_OPTIMIZERS=dmuon,dmuon-ownership,adamw
# NOTE: 1, as the fake-world projection runs (it searches no micro-batch): comparable.
E2E_MICRO_BATCH=1
BUDGET=540
while [ $# -gt 0 ]; do
  case "$1" in
    --stages) STAGES=$2; shift ;;
    --worlds) WORLDS_WANTED=$2; shift ;;
    --step-models) STEP_MODELS=$2; shift ;;
    --e2e-model) E2E_MODEL=$2; shift ;;
    --e2e-optimizers) E2E_OPTIMIZERS=$2; shift ;;
    --e2e-micro-batch) E2E_MICRO_BATCH=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    *) echo "unknown argument $1 (see the header of $0)"; exit 2 ;;
  esac
  shift
done
wants() { [[ ",$STAGES," == *",$1,"* ]]; }

source scripts/device_env.sh

# Stage runner (scripts/stage_runner.sh). NOTE: 20 s of the budget are kept for the summary.
STAGES_TSV="$OUT/stages.tsv" STAGE_RESERVE=20 STAGE_MIN=30
: > "$STAGES_TSV"
source scripts/stage_runner.sh

# One `python -m dmuon bench` command as a stage: its output into $OUT/LOG and, without
# Python's warnings, on screen. Usage: bench_stage NAME LIMIT LOG BENCH-ARGS…
bench_stage() {
  local name=$1 limit=$2 log=$3
  shift 3
  run_stage "$name" "$limit" bash -c 'python3 -m dmuon bench "$@" 2>&1 | tee "$0" |
    grep -v -E "UserWarning|FutureWarning|DeprecationWarning|warnings.warn"; exit ${PIPESTATUS[0]}' "$OUT/$log" "$@"
}

# Environment: the interconnect, torch/CUDA/NCCL, transformers.
nvidia-smi topo -m 2>/dev/null | head -12
python3 -c "
import torch
print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| NCCL', '.'.join(map(str, torch.cuda.nccl.version())),
      '| GPUs', torch.cuda.device_count())
try:
    import transformers; print('transformers', transformers.__version__)
except ImportError:
    print('transformers: not installed (bench e2e on Hugging Face models will fail)')
"
NUM_GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
WORLDS=$(python3 -c "print(','.join(w for w in '$WORLDS_WANTED'.split(',') if w.strip().isdigit() and 1 <= int(w) <= $NUM_GPUS))")
NUM_WORLDS=$(echo "$WORLDS" | tr ',' '\n' | grep -c .)
echo "world sizes: ${WORLDS:-none} (of $WORLDS_WANTED; $NUM_GPUS GPUs) | stages: $STAGES | budget ${BUDGET} s"

# Build (always: the package must exist on this machine; incremental when warm).
t0=$(date +%s)
if ! source scripts/device_build.sh; then
  printf 'build\tfailed\t%s\n' "$(( $(date +%s) - t0 ))" >> "$OUT/stages.tsv"
  python3 lab/reports/summary.py "$OUT" 2>/dev/null || cat "$OUT/stages.tsv"
  exit 1
fi
printf 'build\tok\t%s\n' "$(( $(date +%s) - t0 ))" >> "$OUT/stages.tsv"
if [ "$NUM_WORLDS" -eq 0 ]; then
  echo "no world size of --worlds fits the GPUs present"
  python3 lab/reports/summary.py "$OUT"
  exit 1
fi

# 1. Correctness over NCCL: the CPU suite's distributed scenarios at every world size.
if wants test; then
  run_stage "pytest multigpu" $(( 60 + 90 * NUM_WORLDS )) \
    bash -c "python3 -m pytest -q -p no:cacheprovider -m multigpu tests/python/test_multigpu.py 2>&1 \
             | tee '$OUT/pytest_multigpu.log' | tail -25; exit \${PIPESTATUS[0]}"
fi

# 2. Optimizer step (owner vs gather vs fused AdamW) per model at every world size.
if wants step; then
  for model in ${STEP_MODELS//,/ }; do
    bench_stage "bench step $model" $(( 60 + 100 * NUM_WORLDS )) "step_$model.log" \
      step --model "$model" --worlds "$WORLDS" --json "$OUT/step_$model.json"
  done
fi

# 3. End-to-end training step on every GPU: each optimizer vs AdamW, largest micro-batch.
if wants e2e; then
  bench_stage "bench e2e $E2E_MODEL" 300 "e2e_$E2E_MODEL.log" e2e --model "$E2E_MODEL" --world auto --seq 4096 \
    --micro-batch "$E2E_MICRO_BATCH" --optimizers "$E2E_OPTIMIZERS" --json "$OUT/e2e_$E2E_MODEL.json"
fi

# 4. Qwen2.5-7B's training step at world 8 (only where 8 GPUs are present).
if wants e2e7b && [ "$NUM_GPUS" -ge 8 ]; then
  bench_stage "bench e2e qwen2.5-7b, 8 GPUs" 300 e2e_qwen2.5-7b.log e2e --model qwen2.5-7b --world 8 --seq 4096 \
    --micro-batch 1 --steps 3 --warmup 2 --optimizers "$E2E_OPTIMIZERS" --json "$OUT/e2e_qwen2.5-7b.json"
fi

# 5. The fake-world projection of the same steps on one GPU of this machine, then its error
# against the figures measured above (lab/reports/projection_check.py pairs the JSON records).
if wants project; then
  for model in ${STEP_MODELS//,/ }; do
    for world in ${WORLDS//,/ }; do
      [ "$world" -gt 1 ] || continue
      run_stage "fake step $model w$world" 150 \
        bash -c "python3 -m dmuon bench step --model '$model' --fake-world '$world' --ranks slowest \
                 --json '$OUT/fake_step_${model}_w${world}.json' > '$OUT/fake_step_${model}_w${world}.log' 2>&1"
    done
  done
  if [ "$NUM_GPUS" -gt 1 ]; then
    run_stage "fake e2e $E2E_MODEL w$NUM_GPUS" 200 \
      bash -c "python3 -m dmuon bench e2e --model '$E2E_MODEL' --fake-world '$NUM_GPUS' --seq 4096 \
               --micro-batch '$E2E_MICRO_BATCH' --optimizers dmuon,adamw \
               --json '$OUT/fake_e2e_${E2E_MODEL}_w${NUM_GPUS}.json' > '$OUT/fake_e2e_${E2E_MODEL}.log' 2>&1"
  fi
  python3 lab/reports/projection_check.py "$OUT" | tee "$OUT/projection_check.txt"
fi

# 6. The same training step on one GPU: weight-ownership vs owner mode vs AdamW.
if wants e2e1; then
  bench_stage "bench e2e qwen2.5-0.5b, 1 GPU" 200 e2e_1gpu.log e2e --model qwen2.5-0.5b --world 1 --seq 4096 \
    --micro-batch auto --optimizers dmuon-ownership,dmuon,adamw --json "$OUT/e2e_1gpu.json"
fi

echo "total: $(( $(date +%s) - START )) s"
python3 lab/reports/summary.py "$OUT"
# Exit status: 0 only if every stage that ran or was skipped for the budget was ok.
if cut -f2 "$OUT/stages.tsv" | grep -qv '^ok$'; then exit 1; fi
