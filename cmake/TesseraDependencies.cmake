# Finds every dependency of the design card from Debian's packages. A missing one stops the
# configure step with one line naming the package to install (tools/install-deps.sh installs all).

macro(tessera_require found package what)
  if(NOT ${found})
    message(FATAL_ERROR "tessera: ${what} not found: install the Debian package '${package}' (or run tools/install-deps.sh)")
  endif()
endmacro()

find_package(Threads REQUIRED)

# LibTorch: Debian's 1.13 (found without hints), or a 2.x given by Torch_DIR / CMAKE_PREFIX_PATH.
find_package(Torch QUIET)
tessera_require(Torch_FOUND libtorch-dev "LibTorch (TorchConfig.cmake)")
# c10d's ProcessGroupGloo.hpp includes <gloo/...>; libtorch-dev does not depend on libgloo-dev.
find_path(TESSERA_GLOO_INCLUDE_DIR gloo/config.h)
tessera_require(TESSERA_GLOO_INCLUDE_DIR libgloo-dev "Gloo headers (gloo/config.h)")
find_library(TESSERA_GLOO_LIBRARY NAMES gloo libgloo.so.0)
tessera_require(TESSERA_GLOO_LIBRARY libgloo-dev "Gloo library")

# CAF 0.17 ships no CMake package: import it by hand.
find_path(TESSERA_CAF_INCLUDE_DIR caf/all.hpp)
find_library(TESSERA_CAF_CORE_LIBRARY caf_core)
tessera_require(TESSERA_CAF_INCLUDE_DIR libcaf-dev "CAF headers (caf/all.hpp)")
tessera_require(TESSERA_CAF_CORE_LIBRARY libcaf-dev "CAF library (libcaf_core)")
if(NOT TARGET caf::core)
  add_library(caf::core UNKNOWN IMPORTED)
  set_target_properties(caf::core PROPERTIES
    IMPORTED_LOCATION "${TESSERA_CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_CAF_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
find_package(ucx QUIET)
tessera_require(ucx_FOUND libucx-dev "UCX (ucx CMake package)")
find_package(OpenSSL QUIET COMPONENTS Crypto)
tessera_require(OpenSSL_FOUND libssl-dev "OpenSSL libcrypto (the store's HMAC-SHA256 handshake)")
find_package(tomlplusplus 3 QUIET)
tessera_require(tomlplusplus_FOUND libtomlplusplus-dev "toml++ 3")
find_package(nlohmann_json 3 QUIET)
tessera_require(nlohmann_json_FOUND nlohmann-json3-dev "nlohmann_json 3")
find_package(CLI11 QUIET)
tessera_require(CLI11_FOUND libcli11-dev "CLI11")
find_package(fmt QUIET)
tessera_require(fmt_FOUND libfmt-dev "fmt")
find_package(spdlog QUIET)
tessera_require(spdlog_FOUND libspdlog-dev "spdlog")
# tessera_import(<NAME> <header> <library> <Debian package> <what>): a library that ships no CMake
# package on Debian, imported by hand as tessera::<library> (TESSERA_<NAME>_INCLUDE_DIR/_LIBRARY).
macro(tessera_import name header library package what)
  find_path(TESSERA_${name}_INCLUDE_DIR ${header})
  find_library(TESSERA_${name}_LIBRARY ${library})
  tessera_require(TESSERA_${name}_INCLUDE_DIR ${package} "${what} headers (${header})")
  tessera_require(TESSERA_${name}_LIBRARY ${package} "${what} library")
  if(NOT TARGET tessera::${library})
    add_library(tessera::${library} UNKNOWN IMPORTED)
    set_target_properties(tessera::${library} PROPERTIES IMPORTED_LOCATION "${TESSERA_${name}_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_${name}_INCLUDE_DIR}")
  endif()
endmacro()
tessera_import(XXHASH xxhash.h xxhash libxxhash-dev "xxHash")     # the weight sync's transfer hashes
tessera_import(URING liburing.h uring liburing-dev "liburing")     # optimizer offload to NVMe
tessera_import(HWLOC hwloc.h hwloc libhwloc-dev "hwloc")           # the host optimizer's threads bound to cores
if(TESSERA_BUILD_TESTS)
  find_package(Catch2 2 QUIET)
  tessera_require(Catch2_FOUND catch2 "Catch2 2.x")
endif()
if(TESSERA_BUILD_BENCH)
  find_package(benchmark QUIET)
  tessera_require(benchmark_FOUND libbenchmark-dev "Google Benchmark")
endif()

if(TESSERA_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  tessera_require(CUDAToolkit_FOUND "cuda-toolkit (expected in /usr/local/cuda)" "CUDA toolkit")
  find_path(TESSERA_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(TESSERA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64)
  tessera_require(TESSERA_NCCL_INCLUDE_DIR "libnccl-dev (or NCCL in /usr/local/cuda)" "NCCL headers")
  tessera_require(TESSERA_NCCL_LIBRARY "libnccl2 (or NCCL in /usr/local/cuda)" "NCCL library")
  if(NOT TARGET tessera::nccl)
    add_library(tessera::nccl UNKNOWN IMPORTED)
    set_target_properties(tessera::nccl PROPERTIES IMPORTED_LOCATION "${TESSERA_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_NCCL_INCLUDE_DIR}")
  endif()
endif()

# One precompiled <torch/torch.h>, reused by the targets that include it (cmake/TesseraBuildSpeed.cmake).
if(TESSERA_PCH)
  add_library(tessera_torch_pch OBJECT EXCLUDE_FROM_ALL cmake/torch_pch.cpp)
  target_link_libraries(tessera_torch_pch PRIVATE torch)
  target_precompile_headers(tessera_torch_pch PRIVATE <torch/torch.h>)
endif()
