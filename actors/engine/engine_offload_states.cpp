// Engine::offload_states / reload_states (colocated RL): each actor moves the buffers it owns to host
// memory and back (actors/parked_reply.h, core/zero/parked_storage.h); the engine asks for one
// kind at a time, so it knows what each moved, and refuses what touches the buffers meanwhile.
#include <ATen/ATen.h>

#include <algorithm>

#include "actors/ask.h"
#include "actors/engine/engine_impl.h"

namespace tessera {
namespace {

int64_t& bytes_of(OffloadedStates& o, OffloadState kind) {
  switch (kind) {
    case OffloadState::parameters: return o.parameters;
    case OffloadState::gradients: return o.gradients;
    case OffloadState::master_weights: return o.master_weights;
    case OffloadState::optimizer_states: return o.optimizer_states;
  }
  return o.parameters;
}

}  // namespace

OffloadedStates Engine::offload_states(const OffloadStatesOptions& options) {
  auto& s = *impl_;
  s.rethrow_pending();
  s.refuse_during_update("offload_states");
  if (options.device != config::OffloadDevice::cpu)
    throw ConfigError(std::string("offload_states: device ") + config::name_of(options.device) +
                      ": only cpu (host memory) is supported");
  if (s.stage3 && s.stage3->pinned())
    throw Error("offload_states: called inside gathered_parameters(); end the scope first");
  if (s.micro && !s.micro->at_batch_start())
    throw Error("offload_states: gradients of this accumulation window are pending; call it between step() and the "
                "next backward (at an accumulation boundary)");
  wait_for_checkpoint();  // an asynchronous save reads these buffers
  std::vector<OffloadState> kinds = options.include;
  if (kinds.empty()) kinds.assign(kAllOffloadStates.begin(), kAllOffloadStates.end());
  if (s.inference)
    kinds.erase(std::remove_if(kinds.begin(), kinds.end(), [](OffloadState k) { return k != OffloadState::parameters; }),
                kinds.end());
  const auto host = options.pin_memory ? zero::HostMemory::pinned : zero::HostMemory::pageable;
  if (s.stage3) s.stage3->release_all();
  OffloadedStates moved;
  for (const OffloadState kind : kinds) {
    actors::ParkRequest request{{kind}, host};
    actors::Parked parked;
    const std::string what = std::string("offload_states (") + name_of(kind) + ")";
    if (kind == OffloadState::parameters)
      parked = actors::ask<actors::Parked>(s.parameter_shard, s.bound(), what + ": the parameter-shard", actors::park_atom::value, request);
    else if (kind == OffloadState::gradients)
      parked = actors::ask<actors::Parked>(s.reducer, s.bound(), what + ": the gradient-reducer", actors::park_atom::value, request);
    else
      parked = actors::ask<actors::Parked>(s.optimizer_shard, s.bound(), what + ": the optimizer-shard", actors::park_atom::value, request);
    if (parked.error) std::rethrow_exception(parked.error);
    bytes_of(moved, kind) += parked.bytes;
    bytes_of(s.offloaded, kind) += parked.bytes;
    s.any_offloaded = true;
  }
  return moved;
}

OffloadedStates Engine::reload_states() {
  auto& s = *impl_;
  OffloadedStates back = s.offloaded;
  if (!s.any_offloaded) return back;
  std::exception_ptr failure;
  auto unpark = [&](auto& actor, const char* who) {
    auto parked = actors::ask<actors::Parked>(actor, s.bound(), std::string("reload_states: ") + who, actors::unpark_atom::value);
    if (parked.error && !failure) failure = parked.error;
  };
  unpark(s.parameter_shard, "the parameter-shard");
  if (!s.inference) {
    unpark(s.reducer, "the gradient-reducer");
    unpark(s.optimizer_shard, "the optimizer-shard");
  }
  if (failure) std::rethrow_exception(failure);
  // The .grad views of the flat gradient buffers (stages 0/1) kept their storage, which has new memory.
  for (auto& [p, expected] : s.grad_views)
    if (p.grad().defined()) expected = p.grad().data_ptr();
  s.offloaded = OffloadedStates{};
  s.any_offloaded = false;  // (ZeRO-3's persistent parameters are views of the weight buffers: back too)
  return back;
}

bool Engine::states_offloaded() const { return impl_->any_offloaded; }

}  // namespace tessera
