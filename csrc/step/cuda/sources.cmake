# The CUDA ops of the step engine (csrc/step/cuda): torch-free CUDA C++ over the kernels of
# csrc/ns/cuda. Included from csrc/CMakeLists.txt after the CUDA NS backend, when CUDA
# sources are built.
target_sources(dmuon_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/piece_kernels.cu
  ${CMAKE_CURRENT_LIST_DIR}/normuon_kernels.cu
  ${CMAKE_CURRENT_LIST_DIR}/graph_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_set.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sym_self_check.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cuda_ops.cpp
)
target_compile_definitions(dmuon_core PUBLIC DMUON_WITH_STEP_CUDA=1)
