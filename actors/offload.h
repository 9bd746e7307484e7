// The offload actor owns the host staging of optimizer offload (zero_optimization.offload_optimizer
// .device = "cpu"): `slots` gradient buffers and `slots` weight buffers, each as large as the
// largest sub-group, pinned when the parameters are on a GPU and pin_memory is set. It copies one
// sub-group at a time, on its own thread and in the order it is asked, so that the optimizer-shard
// updates sub-group s on the host while s + 1's gradients come over and s - 1's weights go back.
// On a CPU-only machine the device is host memory too: the same path runs with real copies between
// distinct buffers (what tests and bench/ measure here).
//
// Lends: to_host(slot k) lends gradient slot k until the next to_host naming k; the optimizer-shard
// names k again only after its update of the sub-group in k is done. to_device reads the host
// master before it replies; weight slot k is its own (copies run one after another).
//
// Example: sub-groups of 1 M elements, 2 slots, bf16 parameters with fp32 gradients: 2 x 4 MiB of
// gradient slots and 2 x 2 MiB of weight slots, whatever the model's size.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

#include "actors/protocol.h"

namespace tessera::actors {

struct OffloadStaging {
  int64_t slots = 2;                 // buffers each way (sub-groups in flight)
  int64_t slot_elements = 0;         // the largest sub-group
  at::ScalarType weight_dtype = at::kFloat;  // the parameters'
  c10::Device device = c10::Device(c10::kCPU);  // of the parameters
  bool pin_memory = false;
  int64_t bytes(at::ScalarType gradient_dtype) const;  // gradient and weight slots together
};

// Gradient slots are allocated at the first to_host of each gradient dtype (groups reduced in
// bf16 under torch_autocast next to fp32 ones have their own).
offload_actor spawn_offload(const OffloadStaging& staging);

}  // namespace tessera::actors
