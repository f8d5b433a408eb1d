# What the engine tests share and the product never links: the loopback and no-data
# transports, and the model world with its fp64 Muon.
add_library(dmuon_test_support STATIC
  ${CMAKE_CURRENT_LIST_DIR}/loopback_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_world.cpp
)
target_include_directories(dmuon_test_support PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dmuon_test_support PUBLIC dmuon::core)

# GoogleTest tests of the step engine (csrc/step): its parts, its exchange plan, the
# loopback transport, and the whole engine on the CPU ops against an fp64 Muon, its
# phase times, and the one-GPU step's device memory (counted, on any machine).
add_executable(dmuon_step_tests
  ${CMAKE_CURRENT_LIST_DIR}/test_step_parts.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_exchange_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_loopback.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_early.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_ownership.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_mesh.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_stage_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_normuon.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_col_blocks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_phase_clock.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_serial_worker.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_cost_profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_step_memory.cpp
)
target_link_libraries(dmuon_step_tests PRIVATE dmuon_test_support GTest::gtest GTest::gtest_main)
gtest_discover_tests(dmuon_step_tests DISCOVERY_TIMEOUT 60)

# The CUDA step ops and the engine on a GPU (skip cleanly where no device is visible),
# built where the CUDA sources are.
if(DMUON_HAVE_CUDA)
  add_executable(dmuon_step_cuda_tests ${CMAKE_CURRENT_LIST_DIR}/test_step_cuda.cpp)
  target_link_libraries(dmuon_step_cuda_tests PRIVATE dmuon_test_support GTest::gtest GTest::gtest_main)
  gtest_discover_tests(dmuon_step_cuda_tests DISCOVERY_TIMEOUT 60)
endif()
