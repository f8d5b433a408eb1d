#!/usr/bin/env bash
# accelerate's FSDP2 prepare on one GPU (tests/python/test_accelerate_fsdp2.py) against the
# frameworks the CPU suite pins (tests/requirements.txt), carried to the GPU machine as wheels
# (it reaches no package registry).
#   here:        PYTHON=<the test venv's python> bash scripts/device_frameworks.sh download
#                writes .wheels/ (git-ignored) for the GPU machine's Python 3.12, linux x86_64
#   GPU machine: bash scripts/device_frameworks.sh [pytest arguments…]   (carry .wheels, .cutlass)
#                builds dmuon, installs what its Python lacks, runs the test; logs under $OUT
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
WHEELS=.wheels
# The frameworks the test imports, at the versions tests/requirements.txt pins.
PINNED=$(grep -E '^(transformers|accelerate)==' tests/requirements.txt)

# Here: the pinned frameworks and everything they require, at the versions installed in $PYTHON's
# environment (the ones the CPU suite ran against), as binary wheels for the GPU machine.
# NOTE: torch and numpy are the GPU machine's own (torch 2.11; numpy 2.5.2 meets every
# requirement, and its wheel alone is 16 MB).
download() {
  local python=${PYTHON:-python3}
  local wanted
  # shellcheck disable=SC2086
  wanted=$("$python" - $PINNED <<'EOF'
import importlib.metadata as metadata
import re
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement

environment = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
               "platform_machine": "x86_64", "sys_platform": "linux", "extra": ""}
pinned = dict(arg.split("==") for arg in sys.argv[1:])
found, todo = {}, list(pinned)
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
    if name in found or name in ("torch", "numpy"):
        continue
    dist = metadata.distribution(name)
    if name in pinned and dist.version != pinned[name]:
        sys.exit(f"{name} {dist.version} is installed, tests/requirements.txt pins {pinned[name]}: "
                 "run scripts/run.sh test's install first")
    found[name] = dist.version
    for text in dist.requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            todo.append(requirement.name)
print(" ".join(f"{name}=={version}" for name, version in sorted(found.items())))
EOF
) || return 1
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  echo "downloading: $wanted"
  # shellcheck disable=SC2086
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" $wanted || return 1
  echo "$(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS"
}

# GPU machine: build dmuon, install into a folder on PYTHONPATH exactly the wheels its Python
# lacks (pip's resolver against the installed packages, from $WHEELS only), run the test.
on_device() {
  [ -d "$WHEELS" ] || { echo "no $WHEELS: run 'bash scripts/device_frameworks.sh download' here and carry it"; exit 2; }
  # NOTE: built first, with the machine's own packages (nothing of $WHEELS on the path yet).
  # shellcheck source=scripts/device_build.sh
  source scripts/device_build.sh || exit 1
  local site=/tmp/dmuon_frameworks
  # shellcheck disable=SC2086
  python3 -m pip install -q --dry-run --no-index --find-links "$WHEELS" --report "$OUT/pip_report.json" \
    $PINNED > "$OUT/pip_resolve.log" 2>&1 || { cat "$OUT/pip_resolve.log"; echo "RESOLVE FAILED"; exit 1; }
  local missing
  missing=$(python3 -c "
import json, sys
report = json.load(open(sys.argv[1]))
print(' '.join(item['download_info']['url'].removeprefix('file://') for item in report['install']))" "$OUT/pip_report.json")
  echo "installing into $site: ${missing:-nothing}" | sed "s|$PWD/$WHEELS/||g"
  if [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      $missing || { echo "INSTALL FAILED"; exit 1; }
  fi
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'accelerate', accelerate.__version__, 'gpus', torch.cuda.device_count())" || exit 1
  python3 -m pytest -q -rA tests/python/test_accelerate_fsdp2.py "$@" 2>&1 | tee "$OUT/pytest.log"
}

if [ "${1:-}" = download ]; then
  download
else
  on_device "$@"
fi
