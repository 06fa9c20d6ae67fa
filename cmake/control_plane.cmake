# The control plane's programs: forge-coordinator, the worker agent (forge-worker) and
# forgectl; their libraries (forge_coordinator, forge_worker_agent, forge_cli) are components
# (CMakeLists.txt). The engine links none of this: gRPC stays on this side of the line.

forge_program(forge-coordinator src/coordinator/coordinator_main.cc COMPONENT coordinator
              LINK forge_metrics forge_rpc)
forge_program(forge-worker src/worker/agent/worker_main.cc COMPONENT worker/agent
              LINK forge_rpc forge_worker_parallel)
forge_program(forgectl src/cli/forgectl_main.cc COMPONENT cli LINK forge_rpc)

if(TARGET forge_integration_tests)
  add_dependencies(forge_integration_tests forge-coordinator forge-worker forgectl)
endif()

# --- load benchmark (not a test) -----------------------------------------------------------
if(EXISTS ${CMAKE_SOURCE_DIR}/bench/coordinator_load.cc)
  add_executable(forge-coordinator-load bench/coordinator_load.cc)
  target_link_libraries(forge-coordinator-load PRIVATE forge_rpc)
  target_compile_options(forge-coordinator-load PRIVATE ${FORGE_WARNINGS})
  if(TARGET forge_integration_tests)  # ProgramFlags runs every program's --help
    add_dependencies(forge_integration_tests forge-coordinator-load)
  endif()
endif()
