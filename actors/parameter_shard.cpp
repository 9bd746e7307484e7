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
            // Issued for every group first, then waited for: the gathers overlap each other.
            std::vector<std::shared_ptr<transport::Work>> works;
            for (const auto& group : shared->groups) {
              // The input is a copy: the output (the whole buffer) contains our own partition.
              auto own = group.flat->partition(shared->rank).clone();
              works.push_back(shared->dp->all_gather(own, group.flat->buffer()));
            }
            for (auto& work : works) work->wait();
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
