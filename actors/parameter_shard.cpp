#include "actors/parameter_shard.h"

#include <ATen/ATen.h>

#include "actors/detail/engine_shared.h"
#include "actors/protocol.h"

namespace tessera::actors {
namespace {

caf::behavior parameter_shard(caf::event_based_actor*, std::shared_ptr<detail::EngineShared> shared) {
  return {
      [=](gather_atom) -> GatherReport {
        GatherReport report;
        try {
          if (shared->stage >= 1 && shared->world > 1) {
            const auto& flat = *shared->flat;
            // The input is a copy: the output (the whole buffer) contains our own partition.
            auto own = flat.partition(shared->rank).clone();
            shared->dp->all_gather(own, flat.buffer())->wait();
          }
        } catch (...) {
          report.error = std::current_exception();
        }
        return report;
      },
  };
}

}  // namespace

caf::actor spawn_parameter_shard(caf::actor_system& system, std::shared_ptr<detail::EngineShared> shared) {
  return system.spawn<caf::detached>(parameter_shard, std::move(shared));
}

}  // namespace tessera::actors
