# The control plane: wire contract (proto/forge/v1), forge-coordinator, the worker agent
# (forge-worker), forgectl, and the in-process coordinator behind `forge train`.
# The engine (forge_engine) links none of this: gRPC stays on this side of the line.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)

# --- proto: generated C++ for every proto/forge/v1/*.proto ---------------------------------
file(GLOB FORGE_PROTOS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/proto/forge/v1/*.proto)
set(FORGE_PROTO_OUT ${CMAKE_BINARY_DIR}/proto_gen)
file(MAKE_DIRECTORY ${FORGE_PROTO_OUT})
set(FORGE_PROTO_SRCS "")
foreach(proto ${FORGE_PROTOS})
  get_filename_component(stem ${proto} NAME_WE)
  set(out ${FORGE_PROTO_OUT}/forge/v1/${stem})
  add_custom_command(
    OUTPUT ${out}.pb.cc ${out}.pb.h ${out}.grpc.pb.cc ${out}.grpc.pb.h
    COMMAND protobuf::protoc
      --proto_path=${CMAKE_SOURCE_DIR}/proto
      --cpp_out=${FORGE_PROTO_OUT}
      --grpc_out=${FORGE_PROTO_OUT}
      --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>
      ${proto}
    DEPENDS ${proto} ${FORGE_PROTOS}
    COMMENT "protoc ${stem}.proto")
  list(APPEND FORGE_PROTO_SRCS ${out}.pb.cc ${out}.grpc.pb.cc)
endforeach()
add_library(forge_proto STATIC ${FORGE_PROTO_SRCS})
target_include_directories(forge_proto PUBLIC ${FORGE_PROTO_OUT})
target_link_libraries(forge_proto PUBLIC gRPC::grpc++ protobuf::libprotobuf)

# --- shared client/server plumbing (auth, channel, status mapping) --------------------------
file(GLOB FORGE_RPC_SRC CONFIGURE_DEPENDS src/rpc/*.cc)
add_library(forge_rpc STATIC ${FORGE_RPC_SRC})
target_include_directories(forge_rpc PUBLIC src)
target_link_libraries(forge_rpc PUBLIC forge_proto forge_common)
target_compile_options(forge_rpc PRIVATE ${FORGE_WARNINGS})

# --- coordinator ---------------------------------------------------------------------------
file(GLOB FORGE_COORD_SRC CONFIGURE_DEPENDS src/coordinator/*.cc)
list(FILTER FORGE_COORD_SRC EXCLUDE REGEX "coordinator_main\\.cc$")
add_library(forge_coordinator STATIC ${FORGE_COORD_SRC})
target_include_directories(forge_coordinator PUBLIC src)
target_link_libraries(forge_coordinator PUBLIC forge_rpc forge_engine forge_metrics SQLite::SQLite3)
target_compile_options(forge_coordinator PRIVATE ${FORGE_WARNINGS})

add_executable(forge-coordinator src/coordinator/coordinator_main.cc)
target_link_libraries(forge-coordinator PRIVATE forge_coordinator)
target_compile_options(forge-coordinator PRIVATE ${FORGE_WARNINGS})

# --- worker agent --------------------------------------------------------------------------
file(GLOB FORGE_AGENT_SRC CONFIGURE_DEPENDS src/agent/*.cc)
list(FILTER FORGE_AGENT_SRC EXCLUDE REGEX "worker_main\\.cc$")
add_library(forge_agent STATIC ${FORGE_AGENT_SRC})
target_include_directories(forge_agent PUBLIC src)
target_link_libraries(forge_agent PUBLIC forge_rpc forge_engine forge_metrics)
target_compile_options(forge_agent PRIVATE ${FORGE_WARNINGS})

add_executable(forge-worker src/agent/worker_main.cc)
target_link_libraries(forge-worker PRIVATE forge_agent)
target_compile_options(forge-worker PRIVATE ${FORGE_WARNINGS})

# --- forgectl ------------------------------------------------------------------------------
file(GLOB FORGECTL_SRC CONFIGURE_DEPENDS src/cli/forgectl*.cc src/cli/progress_line.cc
     src/cli/report_html.cc)
add_executable(forgectl ${FORGECTL_SRC})
target_link_libraries(forgectl PRIVATE forge_rpc)
target_compile_options(forgectl PRIVATE ${FORGE_WARNINGS})


# `forge train` launched alone runs an in-process coordinator and a local worker.
target_sources(forge PRIVATE src/cli/local_launch.cc)
target_link_libraries(forge PRIVATE forge_coordinator forge_agent)

# Tests: coordinator unit tests link the coordinator; integration tests run the binaries.
target_link_libraries(forge_unit_tests PRIVATE forge_coordinator forge_agent)
target_sources(forge_unit_tests PRIVATE src/cli/report_html.cc)  # `forgectl report`'s renderer
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
