#include "transport/nccl/nccl_info.h"

#ifdef TESSERA_WITH_CUDA
#include <nccl.h>
#endif

namespace tessera::transport {

std::string nccl_version() {
#ifdef TESSERA_WITH_CUDA
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "error (ncclGetVersion failed)";
  // Since NCCL 2.9 the code is major*10000 + minor*100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string((code / 100) % 100) + "." + std::to_string(code % 100);
#else
  return "not built";
#endif
}

}  // namespace tessera::transport
