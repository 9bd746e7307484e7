#include "actors/parameter_shard.h"

#include <ATen/ATen.h>

#include "actors/actor_runtime.h"
#include "actors/parked_reply.h"

namespace tessera::actors {
namespace {

struct ParameterShardState {
  std::shared_ptr<const EngineSpec> spec;
  std::vector<std::unique_ptr<zero::FlatParameters>> flat;
  std::shared_ptr<transport::Communicator> comm;
  zero::ParkedStorages parked;  // offload_states: the flat buffers in host memory
};

parameter_shard_actor::behavior_type parameter_shard(parameter_shard_actor::stateful_pointer<ParameterShardState> self,
                                                     std::shared_ptr<const EngineSpec> spec,
                                                     std::shared_ptr<std::vector<std::unique_ptr<zero::FlatParameters>>> flat,
                                                     std::shared_ptr<transport::Communicator> comm) {
  auto& s = self->state;
  s.spec = std::move(spec);
  s.flat = std::move(*flat);
  s.comm = std::move(comm);
  return {
      [=](partitions_atom) -> Buffers {
        Buffers out;
        const int64_t owned = self->state.spec->owned_partition();
        for (const auto& f : self->state.flat) out.tensors.push_back(f->partition(owned));
        return out;
      },
      [=](gather_atom) -> Done {
        Done done;
        auto& st = self->state;
        try {
          require_unparked(st.parked, "the parameters' all-gather");
          if (st.spec->plan->stage() >= 1 && st.comm) {
            // Issued for every group first, then waited for: the gathers queue on the
            // communicator's thread back to back. In place: each rank's partition is already
            // where the gather puts it, so nothing is copied or allocated.
            std::vector<std::shared_ptr<transport::Work>> works;
            for (const auto& f : st.flat) works.push_back(st.comm->all_gather_in_place(f->buffer()));
            for (auto& w : works) w->wait();
          }
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](buffers_atom, BufferContents contents) -> Buffers {
        Buffers out;
        for (const auto& f : self->state.flat) {
          out.weight_bytes += int64_t(f->buffer().numel() * f->buffer().element_size());
          if (contents == BufferContents::tensors) out.tensors.push_back(f->buffer());
        }
        return out;
      },
      [=](fetch_atom, const FetchRequest&) -> Done { return Done{}; },  // stages 0-2 keep every parameter gathered
      [=](release_atom, const ReleaseRequest&) {},
      [=](window_atom, WindowEdge) {},
      [=](writeback_atom, const WritebackRequest&) -> Done { return Done{}; },  // every rank holds everything
      [=](park_atom, const ParkRequest& request) -> Parked {
        return parked_reply([&] {
          if (!request.asks(StateKind::parameters)) return int64_t(0);
          std::vector<at::Tensor> buffers;
          for (const auto& f : self->state.flat) buffers.push_back(f->buffer());
          return self->state.parked.park(buffers, request.host);
        });
      },
      [=](unpark_atom) -> Parked { return parked_reply([&] { return self->state.parked.unpark(); }); },
  };
}

}  // namespace

parameter_shard_actor spawn_parameter_shard(std::shared_ptr<const EngineSpec> spec,
                                            std::vector<std::unique_ptr<zero::FlatParameters>> flat,
                                            std::shared_ptr<transport::Communicator> comm) {
  // CAF copies spawn arguments (and a detached actor starts later on its own thread): the
  // buffers travel in a shared holder that the actor empties.
  auto holder = std::make_shared<std::vector<std::unique_ptr<zero::FlatParameters>>>(std::move(flat));
  return actor_system().spawn<caf::detached>(parameter_shard, std::move(spec), std::move(holder), std::move(comm));
}

}  // namespace tessera::actors
