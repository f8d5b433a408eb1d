# Sourced by the device scripts: run_stage NAME LIMIT COMMAND... runs COMMAND under `timeout`,
# clipped to what is left of a total budget, and appends "name<TAB>status<TAB>seconds" to
# $STAGES_TSV. Needs START (epoch seconds) and BUDGET (s); optional STAGE_RESERVE (s of the
# budget kept for the summary, default 20), STAGE_MIN (the least time a stage starts with,
# default 30) and STAGE_LOG (a file the command's output is appended to instead of stdout).
run_stage() {
  local name=$1 limit=$2
  shift 2
  local left=$(( START + BUDGET - ${STAGE_RESERVE:-20} - $(date +%s) ))
  if [ "$left" -lt "${STAGE_MIN:-30}" ]; then
    printf '%s\tskipped (budget spent)\t0\n' "$name" >> "$STAGES_TSV"
    echo "== $name: skipped, ${left} s of the budget left"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (timeout ${limit} s): $*"
  local t0 rc status
  t0=$(date +%s)
  if [ -n "${STAGE_LOG:-}" ]; then
    echo "== $name: $*" >> "$STAGE_LOG"
    timeout --kill-after=15 "$limit" "$@" >> "$STAGE_LOG" 2>&1
  else
    timeout --kill-after=15 "$limit" "$@"
  fi
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timed out after ${limit} s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  printf '%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" >> "$STAGES_TSV"
  echo "== $name: $status in $(( $(date +%s) - t0 )) s"
}
