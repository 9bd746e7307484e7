# cmake --install: libraries, headers and a CMake package so other projects can
#   find_package(tessera) and link tessera::tessera.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
