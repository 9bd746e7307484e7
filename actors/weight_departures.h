// The updated host masters on their way to the device's weights, for the optimizer-shard's
// offloaded update and its write-back after an update during backward: each is a to_device copy
// the offload actor makes (rounding into the weights' dtype), in flight with the sub-group record
// it reads and the weights it writes. When the oldest one's reply comes, its weights are made the
// partition's (PartitionWeights::release: the swap file with parameters on NVMe) and its record is
// released. The first failure is kept; every copy sent is waited for, also after one.
//
// Example: 2 staging slots, 10 sub-groups in host memory: send() and, beyond 2 in flight,
// take_oldest() while the next sub-group steps; take_all() at the end.
#pragma once

#include <ATen/core/Tensor.h>
#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>

#include "actors/partition_weights.h"
#include "actors/protocol.h"

namespace tessera::optim {
class StateStore;
}

namespace tessera::actors {

class WeightDepartures {
 public:
  // All of them outlive this. `failure` receives the first error.
  WeightDepartures(caf::scoped_actor& self, const offload_actor& offload, std::chrono::milliseconds bound,
                   const PartitionWeights& parameters, optim::StateStore& store, std::exception_ptr& failure)
      : self_(self), offload_(offload), bound_(bound), parameters_(parameters), store_(store), failure_(failure) {}

  // Sends sub-group (group, sub)'s master, acquired from the store, into `target` (acquired from
  // the parameters at `begin`) through staging slot `slot`.
  void send(int64_t slot, size_t group, size_t sub, int64_t begin, const at::Tensor& master, const at::Tensor& target);
  void take_oldest();
  void take_all();
  size_t in_flight() const { return leaving_.size(); }

 private:
  using Request = decltype(std::declval<caf::scoped_actor&>()->request(
      std::declval<const offload_actor&>(), std::chrono::milliseconds(), to_device_atom::value, WeightsToDevice{}));
  struct Departure {
    Request request;
    size_t group, sub;
    int64_t begin;
    at::Tensor target;
  };
  caf::scoped_actor& self_;
  const offload_actor& offload_;
  std::chrono::milliseconds bound_;
  const PartitionWeights& parameters_;
  optim::StateStore& store_;
  std::exception_ptr& failure_;
  std::deque<Departure> leaving_;
};

}  // namespace tessera::actors
