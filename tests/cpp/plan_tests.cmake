# GoogleTest tests of the owner planner (csrc/plan).
target_sources(dmuon_core_tests PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/test_plan_problem.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_plan_solvers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_plan_homes.cpp
)
