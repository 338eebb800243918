# Every dependency comes from a Debian 12 package (tools/deps.sh installs them).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(ZLIB REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

# LibTorch is only linked by the dense tiers (nn_sync, dense_worker). The PS and the loader never
# see its headers, which keeps their builds fast on small machines.
if(HYREC_WITH_TORCH)
  find_package(Torch CONFIG REQUIRED)
endif()

find_program(HYREC_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
