#!/usr/bin/env bash
# dmuon's one entry point. Each command installs whatever is missing, builds, then runs:
#   bash scripts/run.sh train [args…]   the main job: train a small GPT with dmuon vs AdamW
#   bash scripts/run.sh test            the whole test suite (C++ ctest + pytest)
#   bash scripts/run.sh build           install dependencies and build only
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=build/py

log() { printf '[dmuon] %s\n' "$*" >&2; }

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

# Python packages, pinned in pyproject.toml (torch==2.11.0).
ensure_python_packages() {
  if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '2.11.0' else 1)" 2>/dev/null; then
    log "installing torch==2.11.0"
    "$PYTHON" -m pip install -q "torch==2.11.0"
  fi
  "$PYTHON" -m pip install -q numpy matplotlib tqdm pytest "scikit-build-core>=0.10" ninja
  # CUTLASS/CuTe headers for the sm_90a symmetric kernel (headers only: --no-deps).
  "$PYTHON" -c "import cutlass_library" 2>/dev/null ||
    "$PYTHON" -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"
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

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    ensure_system_packages; ensure_python_packages; build ;;
  train)
    ensure_system_packages; ensure_python_packages; build
    exec "$PYTHON" -m dmuon train "$@" ;;
  test)
    ensure_system_packages; ensure_python_packages; build
    log "C++ tests (ctest)"
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2
    log "Python tests (pytest)"
    exec "$PYTHON" -m pytest -q tests/python "$@" ;;
  *)
    echo "usage: bash scripts/run.sh {train|test|build} [args…]" >&2; exit 2 ;;
esac
