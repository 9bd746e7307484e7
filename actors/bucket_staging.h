// BucketStaging holds the packed inputs of reduce-to-owner buckets when gradients are partitioned
// (ZeRO-2 across ranks): as each parameter's gradient becomes final it is copied into the buckets
// it overlaps and its .grad is released, so no full-size gradient buffer ever exists, and the
// staging itself is a fixed ring of `slots` buffers of the largest bucket, allocated once.
//
// Buckets get slots strictly in plan order, one slot each. A parameter whose next bucket is next
// in line while every slotted bucket is complete waits for a slot (those reductions finish on
// every rank whatever autograd does next); any other parameter whose bucket has no slot yet keeps
// its .grad (deferred) until the slot comes. A bucket whose last parameter was copied
// is sent to the gradient-reducer (bucket message: the slot is lent), which reduces it to its
// owner and gives the slot back once the reduction finished. At the end of backward take_rest()
// stages everything left in plan order, asking the reducer to reclaim slots when none is free:
// every bucket before the one waiting is complete and issued then, on every rank, so the wait
// always ends (bounded by the engine's timeout).
//
// Threads: take(), take_rest() and start() run where autograd reports gradients (its thread), or
// on the user's thread for a coalesced reduction, one backward at a time; give_back() runs on the
// reducer's thread. Only the free-slot list is shared (SlotRing); a slot's bytes belong to
// whoever holds the slot.
//
// Memory: slots x largest bucket (at most zero::kMaxStagedBucketElements: 2 x 4 MiB in fp32),
// plus the .grad of deferred parameters while they wait.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "actors/engine_spec.h"
#include "actors/protocol.h"
#include "actors/slot_ring.h"

namespace tessera::actors {

class BucketStaging {
 public:
  BucketStaging(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters, int slots = 2);
  void connect(gradient_reducer_actor reducer) { reducer_ = std::move(reducer); }

  void start();                 // a reducing backward begins
  void take(int64_t param);     // parameter `param`'s gradient is final (absent: zeros)
  void take_rest();             // backward ended: every parameter not taken, then every bucket
  void give_back(int slot);     // the reducer is done with `slot`

  int64_t bytes() const { return slot_bytes_ * int64_t(slots_.size()); }

 private:
  void assign_free_slots();
  void copy(int64_t param, size_t bucket);
  void copy_assigned(int64_t param);
  bool may_wait_for(int64_t param) const;
  void wait_for_slot();
  at::Tensor bucket_view(size_t bucket) const;

  std::shared_ptr<const EngineSpec> spec_;
  std::vector<at::Tensor> parameters_;
  gradient_reducer_actor reducer_;
  std::vector<at::Tensor> slots_;  // raw bytes, viewed in each bucket's comm dtype
  int64_t slot_bytes_ = 0;
  // One backward's progress (the reporting thread's alone).
  std::vector<char> ready_;             // per parameter: gradient final
  std::vector<int> uncopied_;           // per parameter: its buckets not copied into yet
  std::vector<int64_t> missing_;        // per bucket: parameters not copied yet
  std::vector<int> slot_of_;            // per bucket: its slot, or -1
  std::vector<std::vector<char>> done_;  // per parameter, per own bucket position: copied
  size_t assigned_ = 0;                 // buckets [0, assigned_) have slots
  SlotRing ring_;  // the free slots, shared with the reducer
};

}  // namespace tessera::actors
