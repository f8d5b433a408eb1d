# GoogleTest tests of the autotune cache (csrc/autotune).
target_sources(dmuon_core_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/test_autotune_cache.cpp)
target_sources(dmuon_core_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/test_timing_rounds.cpp)
