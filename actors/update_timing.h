// When an offloaded optimizer updates a sub-group (tessera.offload.optimizer_during_backward),
// shared by the engine's settings, its spec and the optimizer-shard.
#pragma once

#include <cstdint>

namespace tessera::actors {

enum class UpdateTiming : uint8_t {
  in_step,          // step() updates every sub-group once backward is done
  during_backward,  // each sub-group as soon as its reduced gradients are final, while backward
                    // runs on; step() waits for the rest and writes every sub-group's weights back
};

}  // namespace tessera::actors
