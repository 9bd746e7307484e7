// Live checks of each dependency for `tessera doctor`. Each returns a one-line detail on success
// and throws (any std::exception) with the reason on failure.
#pragma once

#include <string>

namespace tessera::cli::doctor {

std::string libtorch_version();
std::string blas_in_use();             // e.g. "OpenBLAS 0.3.21 (pthread) /usr/lib/.../libblas.so.3"
std::string check_libtorch_autograd();  // a backward pass whose gradient has a closed form
std::string caf_version();
std::string check_caf_request_response();  // two actors, one request with a timeout
std::string check_ucx();                   // context + worker, the transports found
std::string toml_version();
std::string check_toml();
std::string check_json();

}  // namespace tessera::cli::doctor
