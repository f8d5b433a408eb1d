# CUDA: compile the CUDA sources when a toolkit is found (DMUON_CUDA=AUTO) or required (ON).
# NOTE: sm_90a carries the Hopper-only instructions (wgmma, setmaxnreg); compute_80 PTX is
# the portable fallback the driver JIT-compiles on any other GPU of compute capability ≥ 8.0.
set(DMUON_HAVE_CUDA OFF)
if(NOT DMUON_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90a-real;80-virtual")
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
