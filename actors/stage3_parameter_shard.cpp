// The ZeRO-3 parameter-shard (parameter_shard.h): gathers units on demand.
#include <ATen/ATen.h>

#include "actors/actor_runtime.h"
#include "actors/parameter_shard.h"
#include "core/error.h"

namespace tessera::actors {
namespace {

struct Stage3ShardState {
  std::shared_ptr<const EngineSpec> spec;
  std::unique_ptr<zero::Stage3Parameters> params;
  std::shared_ptr<transport::Communicator> comm;
  int64_t fetches = 0;  // fetch number (errors name it)

  // Every segment's piece copied into its place in `gathered` (the segment's padded_numel), then
  // all-gathered in place; waits for all of them.
  void gather_segments(const std::vector<std::pair<int64_t, at::Tensor>>& targets) {
    std::vector<std::shared_ptr<transport::Work>> works;
    for (const auto& [index, gathered] : targets) {
      const auto& s = spec->plan->segments()[size_t(index)];
      gathered.narrow(0, s.layout.partition_begin(spec->rank), s.layout.partition_numel).copy_(params->piece(index));
      if (comm) works.push_back(comm->all_gather_in_place(gathered));
    }
    for (auto& w : works) w->wait();
  }

  void fetch(int64_t unit) {
    const auto& units = spec->plan->units();
    if (unit < 0 || size_t(unit) >= units.size())
      throw Error("ZeRO-3: fetch of unit " + std::to_string(unit) + " of " + std::to_string(units.size()));
    ++fetches;
    if (params->gathered(unit)) return;
    auto alias = params->materialize(unit);
    std::vector<std::pair<int64_t, at::Tensor>> targets;
    for (int64_t index : units[size_t(unit)].segments) {
      const auto& s = spec->plan->segments()[size_t(index)];
      targets.emplace_back(index, alias.narrow(0, s.gathered_offset, s.layout.padded_numel));
    }
    try {
      gather_segments(targets);
    } catch (...) {
      params->release(unit);  // never leave a half-gathered unit looking gathered
      throw;
    }
  }

  void gather_persistent() {
    std::vector<std::pair<int64_t, at::Tensor>> targets;
    for (size_t g = 0; g < spec->plan->groups().size(); ++g) {
      auto persistent = params->persistent_segment(int64_t(g));
      if (!persistent.defined()) continue;
      for (int64_t index : spec->plan->groups()[g].segments)
        if (spec->plan->segments()[size_t(index)].persistent()) targets.emplace_back(index, persistent);
    }
    gather_segments(targets);
  }
};

parameter_shard_actor::behavior_type stage3_shard(parameter_shard_actor::stateful_pointer<Stage3ShardState> self,
                                                  std::shared_ptr<Stage3ShardState> init) {
  self->state = std::move(*init);
  return {
      [=](partitions_atom) -> Buffers {
        Buffers out;
        auto& st = self->state;
        for (size_t g = 0; g < st.spec->plan->groups().size(); ++g) out.tensors.push_back(st.params->partition(int64_t(g)));
        return out;
      },
      [=](gather_atom) -> Done {
        Done done;
        try {
          self->state.gather_persistent();
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](buffers_atom) -> Buffers {
        Buffers out;
        auto& st = self->state;
        for (size_t g = 0; g < st.spec->plan->groups().size(); ++g) out.tensors.push_back(st.params->weight_buffer(int64_t(g)));
        out.gathered_bytes = st.params->gathered_bytes();
        return out;
      },
      [=](fetch_atom, int64_t unit) -> Done {
        Done done;
        try {
          self->state.fetch(unit);
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](release_atom, int64_t unit) {
        auto& st = self->state;
        if (unit < 0) st.params->release_all();
        else if (size_t(unit) < st.spec->plan->units().size()) st.params->release(unit);
      },
  };
}

}  // namespace

parameter_shard_actor spawn_stage3_parameter_shard(std::shared_ptr<const EngineSpec> spec,
                                                   std::unique_ptr<zero::Stage3Parameters> parameters,
                                                   std::shared_ptr<transport::Communicator> comm) {
  auto s = std::make_shared<Stage3ShardState>();
  s->spec = std::move(spec);
  s->params = std::move(parameters);
  s->comm = std::move(comm);
  return actor_system().spawn<caf::detached>(stage3_shard, std::move(s));
}

}  // namespace tessera::actors
