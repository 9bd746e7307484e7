#include "actors/offload.h"

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <vector>

#include "actors/actor_runtime.h"
#include "core/elapsed.h"
#include "core/error.h"

namespace tessera::actors {
namespace {

struct OffloadState {
  OffloadStaging staging;
  std::map<at::ScalarType, std::vector<at::Tensor>> gradient_slots;  // by gradient dtype
  std::vector<at::Tensor> weight_slots;

  at::Tensor host_buffer(at::ScalarType dtype) const {
    // Pinned memory exists only beside a GPU; on a CPU device host and device are one memory.
    const bool pin = staging.pin_memory && staging.device.is_cuda();
    return at::empty({staging.slot_elements}, at::TensorOptions().dtype(dtype).pinned_memory(pin));
  }

  const at::Tensor& slot(std::vector<at::Tensor>& slots, int64_t k, at::ScalarType dtype, const at::Tensor& wanted) {
    if (k < 0 || k >= staging.slots)
      throw Error("offload: staging slot " + std::to_string(k) + " of " + std::to_string(staging.slots));
    if (wanted.numel() > staging.slot_elements)
      throw Error("offload: a sub-group of " + std::to_string(wanted.numel()) + " elements exceeds the staging slots' " +
                  std::to_string(staging.slot_elements));
    if (slots.empty())
      for (int64_t i = 0; i < staging.slots; ++i) slots.push_back(host_buffer(dtype));
    return slots[size_t(k)];
  }
};

offload_actor::behavior_type offload(offload_actor::stateful_pointer<OffloadState> self, OffloadStaging staging) {
  self->state.staging = staging;
  return {
      [=](to_host_atom, const GradientsToHost& m) -> HostGradients {
        HostGradients out;
        try {
          const auto t0 = std::chrono::steady_clock::now();
          auto& slots = self->state.gradient_slots[m.device.scalar_type()];
          out.host = self->state.slot(slots, m.slot, m.device.scalar_type(), m.device).narrow(0, 0, m.device.numel());
          out.host.copy_(m.device);
          out.copy_s = seconds_since(t0);
        } catch (...) {
          out.error = std::current_exception();
        }
        return out;
      },
      [=](to_device_atom, const WeightsToDevice& m) -> Done {
        Done done;
        try {
          auto& s = self->state;
          auto rounded = s.slot(s.weight_slots, m.slot, s.staging.weight_dtype, m.host_master).narrow(0, 0, m.host_master.numel());
          rounded.copy_(m.host_master);  // the rounding the device path does in place (fp32: a copy)
          m.device.copy_(rounded);
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
  };
}

}  // namespace

int64_t OffloadStaging::bytes(at::ScalarType gradient_dtype) const {
  return slots * slot_elements * int64_t(c10::elementSize(gradient_dtype) + c10::elementSize(weight_dtype));
}

offload_actor spawn_offload(const OffloadStaging& staging) {
  return actor_system().spawn<caf::detached>(offload, staging);
}

}  // namespace tessera::actors
