#!/usr/bin/env bash
# Before/after timing of a source change in one device call, so that the baseline comes from
# the same run as the figure (BENCHMARKS.md asks for it; GPU state differs between calls).
#
#   here:    bash lab/device/device_ab.sh prepare [REV]
#            REV's version (default HEAD) of every file the working tree changes, added or
#            deletes goes to .ab/ (git-ignored): .ab/base/PATH, and .ab/files, one
#            "present PATH" or "absent PATH" line per file.
#   device:  bash lab/device/device_ab.sh run [--rounds N] -- COMMAND [ARG…]
#            (through the device tool; carry .ab, and .cutlass for the sm_90a kernel)
#            N rounds (default 1) of: build with REV's files, run COMMAND into
#            $OUT/ab_base_R.txt; build with the working tree's files, run COMMAND into
#            $OUT/ab_new_R.txt. The working tree's files are put back however it ends.
#
# AB_BUILD overrides the build command (default: source scripts/device_build.sh; the builds
# after the first are incremental).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
AB=.ab

usage() {
  echo "usage: bash lab/device/device_ab.sh prepare [REV] | run [--rounds N] -- COMMAND [ARG…]" >&2
  exit 2
}

prepare() {
  local rev=${1:-HEAD}
  git rev-parse --verify --quiet "$rev^{commit}" > /dev/null || { echo "device_ab: no revision '$rev'" >&2; exit 2; }
  rm -rf "$AB"
  mkdir -p "$AB/base"
  local count=0 path
  # NOTE: tracked changes against REV, and untracked files that git does not ignore (the
  # device tool carries those too): both are "the change". Never this script itself (bash
  # reads it while it runs).
  while IFS= read -r path; do
    [ -n "$path" ] || continue
    if git cat-file -e "$rev:$path" 2> /dev/null; then
      mkdir -p "$AB/base/$(dirname "$path")"
      git show "$rev:$path" > "$AB/base/$path"
      echo "present $path" >> "$AB/files"
    else
      echo "absent $path" >> "$AB/files"
    fi
    count=$((count + 1))
  done < <({ git diff --name-only "$rev" --; git ls-files --others --exclude-standard; } | sort -u |
           grep -v -x -e "lab/device/device_ab.sh" -e "$AB/.*")
  [ "$count" -gt 0 ] || { echo "device_ab: the working tree does not differ from $rev" >&2; rm -rf "$AB"; exit 2; }
  echo "$rev $(git rev-parse --short "$rev")" > "$AB/rev"
  echo "device_ab: $count file(s) differ from $rev; base versions in $AB/ (carry it: \"$AB\")"
  cat "$AB/files"
}

# Put one side's files in place: "base" (REV's) or "new" (the working tree's, saved in $saved).
use() {
  local side=$1 state path
  while read -r state path; do
    if [ "$side" = base ]; then
      if [ "$state" = present ]; then
        mkdir -p "$(dirname "$path")"
        cp "$AB/base/$path" "$path"
      else
        rm -f "$path"
      fi
    elif [ -e "$saved/new/$path" ]; then
      mkdir -p "$(dirname "$path")"
      cp "$saved/new/$path" "$path"
    else
      rm -f "$path"
    fi
  done < "$AB/files"
}

run() {
  local rounds=1
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --rounds) rounds=${2:-}; shift 2 ;;
      *) usage ;;
    esac
  done
  [ "${1:-}" = "--" ] && shift
  [ $# -gt 0 ] || usage
  [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "device_ab: --rounds must be a positive integer, got '$rounds'" >&2; exit 2; }
  [ -f "$AB/files" ] || { echo "device_ab: no $AB/files: run 'prepare' first and carry $AB" >&2; exit 2; }
  OUT=${OUT:-/tmp/dmuon_out}
  export OUT
  mkdir -p "$OUT"
  # The working tree's versions, kept aside and put back on any exit.
  saved=$(mktemp -d)
  local state path
  while read -r state path; do
    if [ -e "$path" ]; then
      mkdir -p "$saved/new/$(dirname "$path")"
      cp "$path" "$saved/new/$path"
    fi
  done < "$AB/files"
  trap 'use new; rm -rf "$saved"' EXIT
  echo "device_ab: base = $(cat "$AB/rev" 2> /dev/null), $(wc -l < "$AB/files") file(s), $rounds round(s): $*"
  local round side
  for round in $(seq 1 "$rounds"); do
    for side in base new; do
      use "$side"
      if ! eval "${AB_BUILD:-source scripts/device_build.sh}" > "$OUT/ab_build_${side}_$round.log" 2>&1; then
        tail -20 "$OUT/ab_build_${side}_$round.log"
        echo "device_ab: the $side build failed (round $round)"
        exit 1
      fi
      echo "== $side, round $round"
      "$@" > "$OUT/ab_${side}_$round.txt" 2>&1
      echo "(exit $?, output in \$OUT/ab_${side}_$round.txt)"
      tail -"${AB_TAIL:-12}" "$OUT/ab_${side}_$round.txt"
    done
  done
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
