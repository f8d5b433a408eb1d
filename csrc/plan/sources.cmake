# The owner planner (csrc/plan): torch-free, part of dmuon_core. Included from
# csrc/CMakeLists.txt after dmuon_core is defined.
target_sources(dmuon_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/problem.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cost_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/round_robin.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lpt.cpp
  ${CMAKE_CURRENT_LIST_DIR}/milp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/planner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_spread.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_windows.cpp
)
# NOTE: without CBC (the GPU machines have none) milp.cpp falls back to LPT with a warning.
if(DMUON_HAVE_CBC)
  target_link_libraries(dmuon_core PUBLIC PkgConfig::CBC)
  target_compile_definitions(dmuon_core PRIVATE DMUON_WITH_CBC=1)
endif()
