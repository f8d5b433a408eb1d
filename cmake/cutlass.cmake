# CUTLASS 3.x / CuTe headers (header-only) for the sm_90a symmetric-product kernel.
# Looked up, first match wins: -DDMUON_CUTLASS_DIR=…, the environment's DMUON_CUTLASS_DIR,
# the source tree's .cutlass/include (an unpacked `nvidia-cutlass` wheel), and the
# installed `nvidia-cutlass` wheel (cutlass_library/source/include).
# NOTE: without the headers the build still succeeds; the symmetric kernel is then left
# out and the CUDA backend is not offered (the ATen path is used), so CPU-only CI stays green.
set(DMUON_CUTLASS_INCLUDE_DIR "")
set(_cutlass_candidates "")
if(DEFINED DMUON_CUTLASS_DIR AND NOT DMUON_CUTLASS_DIR STREQUAL "")
  list(APPEND _cutlass_candidates "${DMUON_CUTLASS_DIR}" "${DMUON_CUTLASS_DIR}/include")
endif()
if(DEFINED ENV{DMUON_CUTLASS_DIR})
  list(APPEND _cutlass_candidates "$ENV{DMUON_CUTLASS_DIR}" "$ENV{DMUON_CUTLASS_DIR}/include")
endif()
list(APPEND _cutlass_candidates "${PROJECT_SOURCE_DIR}/.cutlass/include")
find_package(Python QUIET COMPONENTS Interpreter)
if(Python_Interpreter_FOUND)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, cutlass_library; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _cutlass_wheel_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cutlass_rc)
  if(_cutlass_rc EQUAL 0)
    list(APPEND _cutlass_candidates "${_cutlass_wheel_dir}")
  endif()
endif()
foreach(_dir IN LISTS _cutlass_candidates)
  if(EXISTS "${_dir}/cute/tensor.hpp" AND EXISTS "${_dir}/cutlass/cutlass.h")
    set(DMUON_CUTLASS_INCLUDE_DIR "${_dir}")
    break()
  endif()
endforeach()
if(DMUON_CUTLASS_INCLUDE_DIR)
  message(STATUS "dmuon: CUTLASS headers at ${DMUON_CUTLASS_INCLUDE_DIR}")
else()
  message(STATUS "dmuon: CUTLASS headers not found (pip install --no-deps nvidia-cutlass==4.2.0.0); "
                 "the sm_90a symmetric kernel is left out")
endif()
