// Where a ZeRO-3 rank's weight buffers (its partitions and the persistent segments) live: beside
// the units on the parameters' device, in host memory (zero_optimization.offload_param.device =
// "cpu"; page-locked when pin_memory is asked and the units are on a GPU), or with the partitions
// in a swap file (offload_param.device = "nvme": zero::ParameterSwap, a few chunks at a time in host
// memory, the persistent segments in host memory). Units are always on the parameters' device; a
// gather copies the pieces there. Held by the engine's spec and by Stage3Parameters alike: one
// representation from the config to the storage.
#pragma once

#include <cstdint>
#include <string>

#include "core/io/uring_file.h"

namespace tessera::zero {

enum class WeightHome : uint8_t { with_units, host, host_pinned, nvme };

// Whether the weight buffers are off the units' device (what the device holds is the units alone).
inline bool in_host_memory(WeightHome home) { return home != WeightHome::with_units; }

// WeightHome::nvme: the swap file of one rank's partitions (zero::ParameterSwap).
struct ParameterSwapOptions {
  std::string path;               // the swap file (its directory exists)
  int64_t chunk_bytes = 8 << 20;  // at most the largest partition's; rounded up to a multiple of 4096
  int64_t buffers = 4;            // chunks in host memory at most (at least 2)
  io::AioSettings aio;
};

}  // namespace tessera::zero
