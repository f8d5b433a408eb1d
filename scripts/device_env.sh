#!/usr/bin/env bash
# Sourced first by every device script (scripts/, lab/device/): from the repository root,
# $OUT (default /tmp/dmuon_out) made, unbuffered Python, NVLink multicast off, the system
# compilers, and one line naming the GPUs. Once per shell (scripts/device_build.sh sources it too).
[ -n "${DMUON_DEVICE_ENV:-}" ] && return 0
DMUON_DEVICE_ENV=1
OUT=${OUT:-/tmp/dmuon_out}
mkdir -p "$OUT"
# NOTE: NVLink multicast stays off: on shared multi-GPU hosts a program using it can take
# the GPUs out of service; these are the variables NCCL, PyTorch's symmetric memory and
# NVSHMEM read (the launcher sets them for its ranks too).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# NOTE: the GPU machine's environment sets CC/CXX to /opt/gcc, a toolchain that links
# libstdc++ statically into shared objects. dmuon._C then carries its own libstdc++
# beside the one Python and torch load, and the first iostream use (the planner's
# Plan::serialize) segfaults inside codecvt (seen with cuda-gdb: frames of
# libstdc++'s read_utf8_code_point resolved inside _C.so). Build with the system compilers.
if [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null
