# Torch from the Python that builds us: headers and libraries of the installed wheel,
# without find_package(Torch) (which insists on a matching CUDA toolkit even for a CPU
# build). Defines the target dmuon::torch.
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "dmuon: cannot import torch from ${Python_EXECUTABLE}; install torch first (the supported releases: pyproject.toml)")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 TORCH_DIR)
list(GET _torch_info 1 TORCH_CXX11_ABI)
list(LENGTH _torch_info _n)
set(TORCH_CUDA_VERSION "")
if(_n GREATER 2)
  list(GET _torch_info 2 TORCH_CUDA_VERSION)
endif()
message(STATUS "dmuon: torch at ${TORCH_DIR} (CUDA '${TORCH_CUDA_VERSION}', cxx11 abi ${TORCH_CXX11_ABI})")

add_library(dmuon_torch INTERFACE)
add_library(dmuon::torch ALIAS dmuon_torch)
target_include_directories(dmuon_torch SYSTEM INTERFACE
  "${TORCH_DIR}/include" "${TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(dmuon_torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI} TORCH_API_INCLUDE_EXTENSION_H TORCH_EXTENSION_NAME=_C)
foreach(_lib torch_python torch torch_cpu c10)
  find_library(_path_${_lib} NAMES ${_lib} PATHS "${TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(dmuon_torch INTERFACE "${_path_${_lib}}")
endforeach()

# The CUDA side of torch, when both torch and this build have CUDA.
set(DMUON_TORCH_CUDA OFF)
if(DMUON_HAVE_CUDA AND NOT TORCH_CUDA_VERSION STREQUAL "")
  foreach(_lib torch_cuda c10_cuda)
    find_library(_path_${_lib} NAMES ${_lib} PATHS "${TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
    target_link_libraries(dmuon_torch INTERFACE "${_path_${_lib}}")
  endforeach()
  target_link_libraries(dmuon_torch INTERFACE CUDA::cudart)
  target_compile_definitions(dmuon_torch INTERFACE DMUON_WITH_CUDA=1 USE_CUDA=1)
  set(DMUON_TORCH_CUDA ON)
endif()
message(STATUS "dmuon: torch CUDA ops ${DMUON_TORCH_CUDA}")
