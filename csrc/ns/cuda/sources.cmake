# The CUDA backend of Newton–Schulz (csrc/ns/cuda): torch-free, part of dmuon_core.
# Included from csrc/CMakeLists.txt when CUDA sources are built.
include(${PROJECT_SOURCE_DIR}/cmake/cutlass.cmake)
target_sources(dmuon_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cublaslt_gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tri_sym_product.cu
  ${CMAKE_CURRENT_LIST_DIR}/elementwise.cu
  ${CMAKE_CURRENT_LIST_DIR}/matrix_list.cu
  ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90_sym_device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/autotune.cpp
)
target_link_libraries(dmuon_core PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt)
# NOTE: the shared CUDA runtime, the one torch loads: CMake's default (static cudart linked
# into every target that links CUDA objects) would put a second runtime into dmuon._C.
# The targets that link dmuon_core (dmuon._C, the tests) are created later, in sibling
# directories: they take the default from CMAKE_CUDA_RUNTIME_LIBRARY, set for them here.
set_target_properties(dmuon_core PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared PARENT_SCOPE)
target_compile_definitions(dmuon_core PUBLIC DMUON_WITH_CUDA_NS=1)
if(DMUON_CUTLASS_INCLUDE_DIR)
  # NOTE: the kernel is sm_90a-only (WGMMA, TMA), so it is compiled for that target alone
  # (an object library of its own) instead of also emitting the portable compute_80 PTX:
  # that halves the file's compile time (the build's longest) on CI's 2 cores.
  # NOTE: one object per element type so the instances (sm90_sym_instances.def) compile in parallel.
  add_library(dmuon_ns_sm90 OBJECT ${CMAKE_CURRENT_LIST_DIR}/sm90_sym_product.cu
                                   ${CMAKE_CURRENT_LIST_DIR}/sm90_sym_product_f16.cu
                                   ${CMAKE_CURRENT_LIST_DIR}/sm90_sym_product_bf16.cu)
  set_target_properties(dmuon_ns_sm90 PROPERTIES CUDA_ARCHITECTURES "90a-real"
                                                 POSITION_INDEPENDENT_CODE ON
                                                 CUDA_RUNTIME_LIBRARY Shared)
  target_include_directories(dmuon_ns_sm90 PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../..)
  target_include_directories(dmuon_ns_sm90 SYSTEM PRIVATE ${DMUON_CUTLASS_INCLUDE_DIR})
  # NOTE: CuTe needs relaxed constexpr; -lineinfo keeps compute-sanitizer reports readable.
  target_compile_options(dmuon_ns_sm90 PRIVATE --expt-relaxed-constexpr -lineinfo)
  target_compile_definitions(dmuon_ns_sm90 PRIVATE DMUON_VERSION="${PROJECT_VERSION}")
  if(DMUON_EXPERIMENTAL_KERNELS)
    target_compile_definitions(dmuon_ns_sm90 PRIVATE DMUON_EXPERIMENTAL_KERNELS=1)
  endif()
  message(STATUS "dmuon: experimental sm_90a kernel instances ${DMUON_EXPERIMENTAL_KERNELS} (DMUON_EXPERIMENTAL_KERNELS)")
  target_sources(dmuon_core PRIVATE $<TARGET_OBJECTS:dmuon_ns_sm90>)
  target_compile_definitions(dmuon_core PRIVATE DMUON_WITH_SM90_SYM=1)
endif()
