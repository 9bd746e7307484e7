// Builds an engine's storage maps (storage_maps.h) from its sharding plan and this rank's buffers:
// the plan gives every map (core/zero/sharding_plan.h), this file only names kinds and buffers.
#pragma once

#include <string>
#include <vector>

#include "actors/engine/storage_maps.h"
#include "actors/engine_spec.h"
#include "actors/protocol.h"

namespace tessera::actors {

// `parameters`: the flat parameter buffers (parameter-shard); `optimizer`: masters and states
// (optimizer-shard).
EngineStorage describe_storage(const EngineSpec& spec, const Buffers& parameters, const OptimizerStates& optimizer);

}  // namespace tessera::actors
