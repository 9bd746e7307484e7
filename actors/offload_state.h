// What offload_states/reload_states moves (DeepSpeed's OffloadStateTypeEnum: lp_params,
// lp_grads and contiguous_grad_buffer, hp_params, optim_states), shared by the engine's API and
// its actors' messages.
#pragma once

#include <array>
#include <cstdint>

namespace tessera {

enum class OffloadState : uint8_t {
  parameters,        // the low-precision weights (the module's parameters; ZeRO-3: the partitions)
  gradients,         // gradient buffers, accumulators and reduced partitions
  master_weights,    // fp32 master partitions (none when the weights are their own master)
  optimizer_states,  // every optimizer state partition
};

inline constexpr std::array<OffloadState, 4> kAllOffloadStates = {
    OffloadState::parameters, OffloadState::gradients, OffloadState::master_weights, OffloadState::optimizer_states};

inline const char* name_of(OffloadState s) {
  switch (s) {
    case OffloadState::parameters: return "parameters";
    case OffloadState::gradients: return "gradients";
    case OffloadState::master_weights: return "master_weights";
    case OffloadState::optimizer_states: return "optimizer_states";
  }
  return "?";
}

}  // namespace tessera
