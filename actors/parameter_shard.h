// The parameter-shard actor: owns this rank's partition of the flat parameter buffers and, after
// an update, all-gathers every rank's partition so each rank's module holds the new weights
// (stages 1/2; stage 0 updates everything everywhere and gathers nothing). ZeRO-3 will partition
// and prefetch here. Runs on its own thread: a gather blocks until its collective completes.
#pragma once

#include <caf/fwd.hpp>

#include <memory>

namespace tessera::actors {

namespace detail {
struct EngineShared;
}

caf::actor spawn_parameter_shard(caf::actor_system& system, std::shared_ptr<detail::EngineShared> shared);

}  // namespace tessera::actors
