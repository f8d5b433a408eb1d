#!/usr/bin/env bash
# Build dmuon on a GPU machine (editable install into build/device) for the device scripts.
# Sourced by the device scripts from the repository root (with scripts/device_env.sh); its
# log goes under $OUT. Carry .cutlass (the unpacked nvidia-cutlass headers) so the sm_90a
# kernel is built. EXPERIMENTAL_KERNELS=1: also its experimental instances
# (-DDMUON_EXPERIMENTAL_KERNELS=ON).
source scripts/device_env.sh

# Build (no GoogleTest or CBC on the GPU machine: the core tests and MILP are skipped there).
start=$(date +%s)
if ! python3 -m pip install -q --no-build-isolation --no-deps -e . -Cbuild-dir=build/device \
      -Ccmake.define.DMUON_BUILD_TESTS=OFF \
      -Ccmake.define.DMUON_EXPERIMENTAL_KERNELS=$([ "${EXPERIMENTAL_KERNELS:-0}" = 1 ] && echo ON || echo OFF) \
      > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED"; return 1 2>/dev/null || exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
grep -h "CUTLASS" "$OUT/build.log" build/device/CMakeCache.txt 2>/dev/null | head -2
SO=$(ls build/device/csrc/torch/_C*.so 2>/dev/null | head -1)
if [ -n "$SO" ] && command -v cuobjdump >/dev/null; then
  echo "SASS of the sym kernel: $(cuobjdump -sass "$SO" 2>/dev/null | grep -c HGMMA) HGMMA, $(cuobjdump -sass "$SO" 2>/dev/null | grep -c UTMALDG) UTMALDG"
fi

