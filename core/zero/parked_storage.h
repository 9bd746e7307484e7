// ParkedStorages moves tensors' memory to the host and back without touching the tensors
// (offload_states/reload_states, between training and generation when both share the devices).
// park() copies each distinct storage (views share one) into a host buffer, pinned when asked and
// the storage is on a GPU, and frees the storage's own memory at storage level: the tensors, their
// views and everything that holds them (the module's parameters, .grad, autograd) keep their
// TensorImpl and shape but have no memory, as a released ZeRO-3 unit does. unpark() allocates each
// storage again with its own allocator, copies the bytes back and drops the host buffers: the
// values are bit for bit those parked. Touching a parked tensor is the caller's to prevent.
//
// Example: park({exp_avg, exp_avg_sq}) on a rank with 1 M-element fp32 partitions moves 8 MB and
// returns 8'000'000; the tensors' storages have 0 bytes until unpark() returns 8'000'000.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <vector>

namespace tessera::zero {

enum class HostMemory : uint8_t { pageable, pinned };

class ParkedStorages {
 public:
  // Parks every distinct storage of `tensors` that has memory and is not parked yet (undefined
  // tensors are skipped); returns the bytes moved.
  int64_t park(const std::vector<at::Tensor>& tensors, HostMemory host = HostMemory::pageable);
  // Brings every parked storage back; returns the bytes moved.
  int64_t unpark();
  bool empty() const { return parked_.empty(); }
  int64_t bytes() const;  // held in host buffers now

 private:
  struct Parked {
    c10::intrusive_ptr<c10::StorageImpl> storage;
    at::Tensor host;  // [nbytes] uint8 on the CPU
    size_t nbytes = 0;
  };
  std::vector<Parked> parked_;
};

}  // namespace tessera::zero
