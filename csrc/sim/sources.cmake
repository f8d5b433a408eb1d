# The step projection (csrc/sim): torch-free, part of dmuon_core. Included from
# csrc/CMakeLists.txt after dmuon_core is defined.
target_sources(dmuon_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/topology.cpp
  ${CMAKE_CURRENT_LIST_DIR}/traffic.cpp
  ${CMAKE_CURRENT_LIST_DIR}/collective_cost.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rank_prediction.cpp
)
