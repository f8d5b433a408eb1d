# The autotune cache (csrc/autotune): torch-free, no CUDA, part of dmuon_core (the CUDA
# search that fills it lives in csrc/ns/cuda/autotune.*). Included from csrc/CMakeLists.txt.
target_sources(dmuon_core PRIVATE ${CMAKE_CURRENT_LIST_DIR}/tune_cache.cpp)
