// Builds an engine's storage maps (storage_maps.h) from its shared state: one place that knows how
// the flat groups of stages 0/1/2 relate to the affine layer's ZeRO builders.
#pragma once

#include <string>
#include <vector>

#include "actors/detail/engine_shared.h"
#include "actors/storage_maps.h"

namespace tessera::actors {

// `states[g]` are flat group g's optimizer states in `state_names` order.
EngineStorage describe_storage(const detail::EngineShared& shared, const std::vector<std::string>& state_names,
                               const std::vector<std::vector<at::Tensor>>& states);

}  // namespace tessera::actors
