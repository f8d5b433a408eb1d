# GoogleTest tests of the step engine (csrc/step): its parts, the loopback transport, and
# the whole engine on the CPU ops against an fp64 Muon.
add_executable(dmuon_step_tests
  ${CMAKE_CURRENT_LIST_DIR}/step_world.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_parts.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_loopback.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_engine.cpp
)
target_include_directories(dmuon_step_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dmuon_step_tests PRIVATE dmuon::core GTest::gtest GTest::gtest_main)
gtest_discover_tests(dmuon_step_tests DISCOVERY_TIMEOUT 60)
