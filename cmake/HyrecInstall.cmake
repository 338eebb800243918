# `cmake --install` puts hyrec's headers, libraries and binaries under the prefix, with a CMake
# package, so that a project of its own builds against it:
#
#   find_package(hyrec REQUIRED)
#   target_link_libraries(my_trainer PRIVATE hyrec::train_main)   # or hyrec::dense_worker, ...
#
# examples/custom_model is such a project; tests/readme_test.sh builds it against an install, as README.md says.
include(CMakePackageConfigHelpers)

set(HYREC_EXPORTED_LIBRARIES
  hyrec_common:common hyrec_security:security hyrec_rpc:rpc hyrec_metrics_http:metrics_http hyrec_proto:proto hyrec_embedding_ps:embedding_ps
  hyrec_data_loader:data_loader hyrec_job:job hyrec_ps_role:ps_role hyrec_loader_role:loader_role
  hyrec_rendezvous:rendezvous hyrec_health:health hyrec_planner:planner hyrec_deploy:deploy
  hyrec_restart_policy:restart_policy hyrec_worker_schedule:worker_schedule)
if(HYREC_HAS_KAFKA)
  list(APPEND HYREC_EXPORTED_LIBRARIES hyrec_kafka:kafka)
endif()
if(HYREC_WITH_TORCH)
  list(APPEND HYREC_EXPORTED_LIBRARIES hyrec_nn_sync:nn_sync hyrec_dense_worker:dense_worker
    hyrec_train_main:train_main)
endif()
set(HYREC_INSTALLED_TARGETS)
foreach(entry ${HYREC_EXPORTED_LIBRARIES})
  string(REPLACE ":" ";" pair ${entry})
  list(GET pair 0 target)
  list(GET pair 1 export_name)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  list(APPEND HYREC_INSTALLED_TARGETS ${target})
endforeach()

install(TARGETS ${HYREC_INSTALLED_TARGETS} EXPORT hyrecTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/hyrec DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(HYREC_INSTALLED_BINARIES hyrec hyrec-ps hyrec-loader hyrec-ps-demo hyrec-checkpoint hyrec-certs hyrec-k8s hyrec-plan)
if(HYREC_WITH_TORCH)
  list(APPEND HYREC_INSTALLED_BINARIES hyrec-train hyrec-worker hyrec-export hyrec-predict hyrec-eval)
endif()
install(TARGETS ${HYREC_INSTALLED_BINARIES} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(HYREC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hyrec)
install(EXPORT hyrecTargets NAMESPACE hyrec:: DESTINATION ${HYREC_CMAKE_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/hyrecConfig.cmake.in
  ${CMAKE_BINARY_DIR}/hyrecConfig.cmake INSTALL_DESTINATION ${HYREC_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/hyrecConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/hyrecConfig.cmake ${CMAKE_BINARY_DIR}/hyrecConfigVersion.cmake
  DESTINATION ${HYREC_CMAKE_DIR})

# The build tree keeps its debug information (RelWithDebInfo, for debugging and profiling); the
# installed binaries and static libraries are stripped of it, so that an install is small (the
# image's, and a prefix one builds against). HYREC_INSTALL_DEBUG=ON keeps it.
option(HYREC_INSTALL_DEBUG "Install the binaries and libraries with their debug information" OFF)
if(NOT HYREC_INSTALL_DEBUG AND CMAKE_STRIP)
  set(HYREC_STRIPPED_FILES)
  foreach(target ${HYREC_INSTALLED_BINARIES})
    list(APPEND HYREC_STRIPPED_FILES "${CMAKE_INSTALL_BINDIR}/$<TARGET_FILE_NAME:${target}>")
  endforeach()
  foreach(target ${HYREC_INSTALLED_TARGETS})
    list(APPEND HYREC_STRIPPED_FILES "${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:${target}>")
  endforeach()
  install(CODE "
    foreach(file ${HYREC_STRIPPED_FILES})
      set(path \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/\${file}\")
      execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug \"\${path}\" RESULT_VARIABLE result)
      if(NOT result EQUAL 0)
        message(FATAL_ERROR \"strip --strip-debug \${path} failed (\${result})\")
      endif()
    endforeach()
  ")
endif()
