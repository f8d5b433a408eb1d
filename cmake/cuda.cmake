# CUDA: compile the CUDA sources when a toolkit is found (DMUON_CUDA=AUTO) or required (ON).
# NOTE: SASS for the GPUs users have: A100/A800 (sm_80), RTX 30xx/A10/A40 (sm_86), L4/L40S/RTX
# 40xx (sm_89), H100/H200 (sm_90a: the Hopper-only instructions, wgmma and setmaxnreg, of the
# symmetric kernel, which is compiled for it alone: ns/cuda/sources.cmake) and B200/GB200
# (sm_100); compute_100 PTX for every newer GPU (the driver JIT-compiles it). CUDA 13 dropped
# the older targets (nvcc --list-gpu-arch starts at compute_75).
set(DMUON_HAVE_CUDA OFF)
if(NOT DMUON_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80-real;86-real;89-real;90a-real;100-real;100-virtual")
    endif()
    enable_language(CUDA)
    # NOTE: C++17 for CUDA sources: none includes a torch header, and CMake 3.25.1 (Debian
    # 12's) knows no C++20 dialect for nvcc (CMAKE_CUDA_STANDARD 20 fails at configure; 3.25.2
    # added it). nvcc 13.0 compiles all 9 .cu files, CUTLASS/CuTe headers included, at
    # -std=c++20 without a warning: raising this is one line once the CMake floor allows it.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(DMUON_HAVE_CUDA ON)
  elseif(DMUON_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DMUON_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "dmuon: CUDA sources ${DMUON_HAVE_CUDA}")
