#!/usr/bin/env bash
# dmuon's one entry point. Each command installs whatever is missing, builds, then runs:
#   bash scripts/run.sh train [args…]   the main job: train a small GPT with dmuon vs AdamW
#   bash scripts/run.sh test            the whole test suite (C++ ctest + pytest)
#   bash scripts/run.sh build           install dependencies and build only
# Each takes --torch newest first: the same against the newest torch of the supported range,
# in a virtual environment of its own (build/venv-torch-newest, build dir build/py-torchX.Y).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=build/py
# The supported torch releases: pyproject.toml's dependency, the one place they are written.
TORCH_SPEC=$(sed -n 's/^dependencies = \[.*"\(torch[^"]*\)".*/\1/p' pyproject.toml)

log() { printf '[dmuon] %s\n' "$*" >&2; }

# Runs a phase and logs its elapsed seconds (so CI logs show where the time goes).
# NOTE: not inside `||` or `if`: there bash would ignore set -e in the phase's functions.
timed() {
  local phase=$1 start=$SECONDS
  shift
  "$@"
  log "$phase: $((SECONDS - start)) s"
}

# System packages: compiler, CMake, GoogleTest, COIN-OR CBC (MILP planner).
ensure_system_packages() {
  local wanted=(g++ cmake ninja-build pkg-config googletest libgtest-dev coinor-libcbc-dev)
  local missing=()
  for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    log "installing system packages: ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    log "missing system packages (${missing[*]}); install them with apt-get as root"
    return 1
  fi
}

# Python packages. torch: an installed release in the supported range is kept (pip leaves a
# satisfied requirement alone), else the newest in range is installed.
ensure_python_packages() {
  "$PYTHON" -m pip install -q "$TORCH_SPEC" numpy matplotlib tqdm pytest "scikit-build-core>=0.10" ninja
  log "torch $("$PYTHON" -c 'import torch; print(torch.__version__)') (supported: $TORCH_SPEC)"
  # CUTLASS/CuTe headers for the sm_90a symmetric kernel (headers only: --no-deps).
  "$PYTHON" -c "import cutlass_library" 2>/dev/null ||
    "$PYTHON" -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"
}

# The frameworks the integration tests run against (tests/requirements*.txt), so that none
# of them skips. NOTE: with the packages above, 58 wheels on top of torch: from PyPI with an
# empty pip cache on a 2-core machine under load 13-43, 78 s installed as pip does by default,
# 31 s without compiling their .py files (326 MB), which only the modules the tests import
# then need (Python compiles those on first import).
ensure_test_packages() {
  "$PYTHON" -m pip install -q --no-compile -r tests/requirements.txt
  "$PYTHON" -m pip install -q --no-compile --no-deps -r tests/requirements-no-deps.txt
  if trainer_importable; then
    "$PYTHON" -m pip install -q --no-compile --no-deps -r tests/requirements-trainer.txt
  fi
}

# Whether torchtitan's Trainer can import with this torch: its torch.distributed.fsdp exports
# DataParallelMeshDims (torch 2.11's does not). NOTE: read from the file: importing
# torch.distributed.fsdp to ask takes 3 s of CPU on a 2-core machine.
trainer_importable() {
  "$PYTHON" - <<'EOF'
import importlib.util
import pathlib
import sys

fsdp = pathlib.Path(importlib.util.find_spec("torch").origin).parent / "distributed" / "fsdp" / "__init__.py"
sys.exit("DataParallelMeshDims" not in fsdp.read_text())
EOF
}

# Build the core, its tests and dmuon._C into $BUILD_DIR; editable install of the package.
build() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
  fi
  log "building dmuon (build dir $BUILD_DIR)"
  "$PYTHON" -m pip install -q --no-build-isolation --no-deps -e . \
    -Cbuild-dir="$BUILD_DIR" -Ccmake.define.DMUON_BUILD_TESTS=ON
}

# --torch newest: a virtual environment of its own with the newest torch in range from PyPI.
# NOTE: that torch brings its CUDA libraries as nvidia-* wheels (5.5 GB installed for torch
# 2.15.0); the environment is kept and reused, so pip's download cache (another copy in the
# home folder) is turned off for it.
use_newest_torch() {
  local venv=build/venv-torch-newest
  if [ ! -x "$venv/bin/python" ]; then
    log "making $venv"
    "$PYTHON" -m venv "$venv" || { log "cannot make a virtual environment with $PYTHON (Debian: apt-get install python3-venv)"; return 1; }
  fi
  PYTHON=$venv/bin/python
  export PIP_NO_CACHE_DIR=1
  log "installing the newest $TORCH_SPEC into $venv"
  "$PYTHON" -m pip install -q --upgrade "$TORCH_SPEC"
  BUILD_DIR=build/py-torch$("$PYTHON" -c "import torch; print('.'.join(torch.__version__.split('.')[:2]))")
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build|train|test) ;;
  *) echo "usage: bash scripts/run.sh {train|test|build} [--torch newest] [args…]" >&2; exit 2 ;;
esac
if [ "${1:-}" = --torch ]; then
  [ "${2:-}" = newest ] || { echo "--torch takes 'newest' (got '${2:-}')" >&2; exit 2; }
  shift 2
  use_newest_torch
fi
install() {
  ensure_system_packages; ensure_python_packages
  if [ "$cmd" = test ]; then ensure_test_packages; fi
}
case "$cmd" in
  build)
    timed install install; timed build build ;;
  train)
    timed install install; timed build build
    exec "$PYTHON" -m dmuon train "$@" ;;
  test)
    timed install install; timed build build
    log "C++ tests (ctest)"
    timed ctest ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2
    log "Python tests (pytest)"
    timed pytest "$PYTHON" -m pytest -q tests/python "$@" ;;
esac
