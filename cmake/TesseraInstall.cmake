# cmake --install: libraries, headers and a CMake package, so another project can write
#   find_package(tessera REQUIRED)
#   target_link_libraries(app PRIVATE tessera::tessera)
# Headers land in <prefix>/include/tessera/{core,transport,actors}/...; both <prefix>/include and
# <prefix>/include/tessera are on the include path, so <tessera/core/error.h> and the headers'
# own "core/error.h" includes both resolve.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# tessera::tessera: everything a user of the runtime links.
add_library(tessera_all INTERFACE)
target_link_libraries(tessera_all INTERFACE tessera_actors tessera_transport tessera_core)
target_include_directories(tessera_all INTERFACE $<INSTALL_INTERFACE:include>)
set_target_properties(tessera_all PROPERTIES EXPORT_NAME tessera)
add_library(tessera::tessera ALIAS tessera_all)

set(_tessera_targets tessera_all tessera_base tessera_log tessera_core tessera_affine tessera_config tessera_optim tessera_zero_plan tessera_zero tessera_nn tessera_data
    tessera_io_header tessera_io tessera_aio tessera_checkpoint
    tessera_transport tessera_training_actors tessera_engine tessera_rollout tessera_actors)
install(TARGETS ${_tessera_targets} EXPORT tesseraTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION include include/tessera)
install(DIRECTORY core transport actors DESTINATION include/tessera FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/generated/core/version.h DESTINATION include/tessera/core)
install(EXPORT tesseraTargets NAMESPACE tessera:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
configure_package_config_file(cmake/tesseraConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tesseraConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tesseraConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tesseraConfig.cmake ${PROJECT_BINARY_DIR}/tesseraConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
install(PROGRAMS tools/tessera-launch DESTINATION ${CMAKE_INSTALL_BINDIR} OPTIONAL)
# The launcher script finds its package in ../share/tessera/launch.
install(DIRECTORY tools/tessera_launch DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera/launch PATTERN __pycache__ EXCLUDE)
