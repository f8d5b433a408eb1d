# The step engine (csrc/step): torch-free, part of dmuon_core. Included from
# csrc/CMakeLists.txt after dmuon_core is defined; the CUDA ops (csrc/step/cuda) come with
# the CUDA sources.
target_sources(dmuon_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/types.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/items.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stages.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_loads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/exchange_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runtime_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/phase_clock.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cost_profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_early.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_normuon.cpp
  ${CMAKE_CURRENT_LIST_DIR}/start_agreement.cpp
  ${CMAKE_CURRENT_LIST_DIR}/owned_buckets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ownership_exchange.cpp
  ${CMAKE_CURRENT_LIST_DIR}/serial_worker.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu/cpu_ops.cpp
  # NOTE: host rules of the CUDA ops (no CUDA headers), in every build so that they are tested.
  ${CMAKE_CURRENT_LIST_DIR}/cuda/stream_workspaces.cpp
)
