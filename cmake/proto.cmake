# forge_proto: the generated C++ of every proto/forge/v1/*.proto (the control plane's wire
# contract), linked by forge_rpc.
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
