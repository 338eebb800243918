# Every dependency comes from a Debian 12 package (tools/deps.sh installs them).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(ZLIB REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
if(HYREC_WITH_HTTP)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
endif()

# libxxhash-dev has no CMake config; found by path so that a prefix tree of unpacked packages
# (CMAKE_PREFIX_PATH, as in the CUDA build recipe) works without pkg-config.
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
add_library(hyrec_xxhash INTERFACE IMPORTED)
set_target_properties(hyrec_xxhash PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${XXHASH_LIBRARY}")

# librdkafka (librdkafka-dev): the loader's Kafka source. Found by path, as xxhash; a tree without
# it (the CUDA recipe's) builds without the Kafka source, and a job that asks for one is refused.
find_path(RDKAFKA_INCLUDE_DIR librdkafka/rdkafka.h)
find_library(RDKAFKA_LIBRARY rdkafka)
if(RDKAFKA_INCLUDE_DIR AND RDKAFKA_LIBRARY)
  set(HYREC_HAS_KAFKA ON)
  add_library(hyrec_rdkafka INTERFACE IMPORTED)
  set_target_properties(hyrec_rdkafka PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${RDKAFKA_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${RDKAFKA_LIBRARY}")
else()
  set(HYREC_HAS_KAFKA OFF)
  message(WARNING "librdkafka not found: the loader is built without its Kafka source")
endif()

# liburing (liburing-dev): the PS store's disk tier keeps its page reads in flight through
# io_uring; a tree without it (the CUDA recipe's) reads them one at a time with pread. RocksDB
# (librocksdb-dev) is the other way a disk tier could read rows; benchmarks/disk_read_benchmark.cc
# measures both against the disk's own floor and is built only where both are found.
find_path(URING_INCLUDE_DIR liburing.h)
find_library(URING_LIBRARY uring)
if(URING_INCLUDE_DIR AND URING_LIBRARY)
  set(HYREC_HAS_URING ON)
  add_library(hyrec_uring INTERFACE IMPORTED)
  set_target_properties(hyrec_uring PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${URING_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES "${URING_LIBRARY}")
else()
  set(HYREC_HAS_URING OFF)
  message(WARNING "liburing not found: the PS disk tier reads its pages one at a time (install liburing-dev)")
endif()
find_path(ROCKSDB_INCLUDE_DIR rocksdb/db.h)
find_library(ROCKSDB_LIBRARY rocksdb)
if(HYREC_HAS_URING AND ROCKSDB_INCLUDE_DIR AND ROCKSDB_LIBRARY)
  set(HYREC_HAS_DISK_READERS ON)
  add_library(hyrec_disk_readers INTERFACE IMPORTED)
  set_target_properties(hyrec_disk_readers PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${URING_INCLUDE_DIR};${ROCKSDB_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${URING_LIBRARY};${ROCKSDB_LIBRARY}")
else()
  set(HYREC_HAS_DISK_READERS OFF)
endif()

# LibTorch is only linked by the dense tiers (nn_sync, dense_worker). The PS and the loader never
# see its headers, which keeps their builds fast on small machines.
if(HYREC_WITH_TORCH)
  find_package(Torch CONFIG REQUIRED)
  # A CUDA LibTorch (its config finds the CUDA toolkit and lists c10_cuda): NCCL is compiled in.
  set(HYREC_TORCH_HAS_CUDA OFF)
  if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda OR TARGET c10_cuda OR "${TORCH_LIBRARIES}" MATCHES "cuda")
    set(HYREC_TORCH_HAS_CUDA ON)
  endif()
  message(STATUS "LibTorch ${Torch_VERSION}, CUDA: ${HYREC_TORCH_HAS_CUDA}")
endif()

find_program(HYREC_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
