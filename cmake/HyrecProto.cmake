# hyrec_generate_proto(<out_srcs_var> <out_hdrs_var> <proto files...>)
# Runs protoc with the gRPC plugin; outputs land in ${CMAKE_BINARY_DIR}/gen/hyrec/proto.
function(hyrec_generate_proto out_srcs out_hdrs)
  set(gen_dir ${CMAKE_BINARY_DIR}/gen/hyrec/proto)
  file(MAKE_DIRECTORY ${gen_dir})
  set(srcs)
  set(hdrs)
  foreach(proto ${ARGN})
    get_filename_component(abs ${proto} ABSOLUTE)
    get_filename_component(name ${proto} NAME_WE)
    get_filename_component(dir ${abs} DIRECTORY)
    set(outs ${gen_dir}/${name}.pb.cc ${gen_dir}/${name}.pb.h
             ${gen_dir}/${name}.grpc.pb.cc ${gen_dir}/${name}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${outs}
      COMMAND protobuf::protoc
        --proto_path=${dir}
        --cpp_out=${gen_dir}
        --grpc_out=${gen_dir}
        --plugin=protoc-gen-grpc=${HYREC_GRPC_CPP_PLUGIN}
        ${abs}
      DEPENDS ${abs}
      COMMENT "protoc ${name}.proto"
      VERBATIM)
    list(APPEND srcs ${gen_dir}/${name}.pb.cc ${gen_dir}/${name}.grpc.pb.cc)
    list(APPEND hdrs ${gen_dir}/${name}.pb.h ${gen_dir}/${name}.grpc.pb.h)
  endforeach()
  set(${out_srcs} ${srcs} PARENT_SCOPE)
  set(${out_hdrs} ${hdrs} PARENT_SCOPE)
endfunction()
