// Where a ZeRO-3 rank's weight buffers (its partitions and the persistent segments) live: beside
// the units on the parameters' device, or in host memory (zero_optimization.offload_param.device =
// "cpu"; page-locked when pin_memory is asked and the units are on a GPU). Units are always on the
// parameters' device; a gather copies the pieces there. Held by the engine's spec and by
// Stage3Parameters alike: one representation from the config to the storage.
#pragma once

#include <cstdint>

namespace tessera::zero {

enum class WeightHome : uint8_t { with_units, host, host_pinned };

inline bool in_host_memory(WeightHome home) { return home != WeightHome::with_units; }

}  // namespace tessera::zero
