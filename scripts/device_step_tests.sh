#!/usr/bin/env bash
# One device call: build the step engine's GoogleTests on a GPU machine and run them:
# the CUDA step ops against the CPU ops, the NS of a batch with its
# graph, the engine on one GPU; then the CPU step tests for comparison. Optional:
# compute-sanitizer memcheck of the CUDA step tests (--sanitize).
# Needs (carried): .gtest, a copy of GoogleTest's sources (cp -r /usr/src/googletest .gtest
# on a machine that has them: the GPU machines have no GoogleTest), and .cutlass (the
# unpacked nvidia-cutlass headers) so that the sm_90a symmetric kernel is built.
# Writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
SANITIZE=0
[ "${1:-}" = "--sanitize" ] && SANITIZE=1
[ -f .gtest/CMakeLists.txt ] || { echo "no .gtest (carry a copy of /usr/src/googletest)"; exit 2; }
# CMake and Ninja from the system, else from their pip packages (what pip builds use).
CMAKE=$(command -v cmake || python3 -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" 2>/dev/null)
[ -n "$CMAKE" ] || { echo "no cmake (system or pip)"; exit 2; }
NINJA=$(command -v ninja || python3 -c "import ninja, os; print(os.path.join(ninja.BIN_DIR, 'ninja'))" 2>/dev/null)
generator=()
[ -n "$NINJA" ] && [ -x "$NINJA" ] && generator=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA")
cutlass=()
[ -d .cutlass/include ] && cutlass=(-DDMUON_CUTLASS_DIR="$PWD/.cutlass")
start=$(date +%s)
if ! { "$CMAKE" -S . -B build/step_gpu "${generator[@]}" "${cutlass[@]}" -DDMUON_BUILD_PYTHON=OFF -DDMUON_CUDA=ON \
         -DDMUON_CBC=OFF -DDMUON_GTEST_SOURCE_DIR="$PWD/.gtest" &&
       "$CMAKE" --build build/step_gpu -j "$(nproc)" --target dmuon_step_cuda_tests dmuon_step_tests; } \
     > "$OUT/step_build.log" 2>&1; then
  tail -40 "$OUT/step_build.log"; echo "BUILD FAILED"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
grep -h "CUTLASS" "$OUT/step_build.log" | head -1
export DMUON_AUTOTUNE_CACHE=/tmp/dmuon_autotune_step.txt
rm -f "$DMUON_AUTOTUNE_CACHE"
timeout 400 build/step_gpu/tests/cpp/dmuon_step_cuda_tests 2>&1 | tee "$OUT/step_cuda_tests.log" | grep -E "FAILED|Failure|SKIPPED|PASSED|tests ran" | head -40
timeout 120 build/step_gpu/tests/cpp/dmuon_step_tests 2>&1 | tee "$OUT/step_cpu_tests.log" | tail -3
if [ "$SANITIZE" = 1 ]; then
  DMUON_AUTOTUNE=0 timeout 400 compute-sanitizer --tool memcheck --print-limit 10 \
    build/step_gpu/tests/cpp/dmuon_step_cuda_tests --gtest_filter='StepCudaOps.*' 2>&1 | tail -4 | tee "$OUT/step_sanitize.log"
fi
echo "=== summary ==="
grep -E "^\[  (PASSED|FAILED) " "$OUT/step_cuda_tests.log" | head -20
tail -1 "$OUT/step_cpu_tests.log"
