// What this build knows of NCCL: its version when tessera was built with TESSERA_WITH_CUDA.
#pragma once

#include <string>

namespace tessera::transport {

// "2.28.9" when built with CUDA/NCCL, "not built" otherwise. Needs no GPU.
std::string nccl_version();

}  // namespace tessera::transport
