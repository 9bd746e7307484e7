// UnitGradStaging turns ZeRO-3 gradients into reduce-scatters in a fixed order. The order is the
// reverse of the plan's units (backward usually runs the model backwards), then each flat group's
// persistent segment (its parameters, biases and norms all over the model, are complete only at
// the end). As a parameter's gradient becomes final (take), the item it belongs to counts down;
// whenever the next item in the order is complete it is staged, chunk by chunk: a chunk is a run
// [begin, begin + length) of every rank's piece of one segment (at most kMaxStagedBucketElements
// elements over all ranks), copied from the gradients into a slot of a fixed ring, rank r's run
// after rank r-1's (padding zero, a parameter without gradient zero); the slot is lent to the
// gradient-reducer (chunk message), which reduce-scatters it into this rank's run (also in the
// slot), adds that into the partition and gives the slot back. Once an item's chunks are staged
// its parameters' .grad are dropped. A complete item out of order keeps its .grad until its turn;
// take_rest() at the end of backward stages everything left, in order. So every rank issues the
// same reductions in the same order, whatever order autograd reports gradients in; a chunk's sums
// are the whole segment's, element by element, so chunking changes no result.
//
// The ring (two slots of the largest chunk, allocated once) bounds what is in flight: a chunk that
// finds no free slot asks the reducer to finish its oldest reduction (reclaim) and waits for a
// slot, bounded by the engine's timeout. The wait always ends: every chunk before it was staged
// and issued on every rank, in the same order.
//
// Threads: start(), take() and take_rest() run on autograd's thread (or the user's thread for a
// coalesced reduction), one backward at a time; give_back() runs on the reducer's thread. Only the
// free-slot list is shared (SlotRing); a slot's bytes belong to whoever holds the slot.
//
// Memory: 2 slots x (kMaxStagedBucketElements + its 1/W) elements (fp32 at 2 ranks: 12 MiB),
// plus the .grad of items waiting for their turn.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "actors/engine_spec.h"
#include "actors/protocol.h"
#include "actors/slot_ring.h"

namespace tessera::actors {

class UnitGradStaging {
 public:
  // `chunk_elements`: a chunk's elements over all ranks at most (tests make it small).
  UnitGradStaging(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters, int slots = 2,
                  int64_t chunk_elements = zero::kMaxStagedBucketElements);
  void connect(gradient_reducer_actor reducer) { reducer_ = std::move(reducer); }

  void start();              // a reducing backward begins
  void take(int64_t param);  // parameter `param`'s gradient is final for this backward
  void take_rest();          // backward ended: every item not staged yet, in order
  void give_back(int slot);  // the reducer is done with `slot`

  int64_t bytes() const { return slot_bytes_ * int64_t(slots_.size()); }

 private:
  // A run of every rank's piece of one segment, reduce-scattered at once.
  struct Chunk {
    int64_t segment = 0;
    int64_t begin = 0;   // piece-relative
    int64_t length = 0;
  };
  void stage(size_t item);
  void stage_chunk(const Chunk& chunk);
  void issue_ready();
  int acquire_slot();

  std::shared_ptr<const EngineSpec> spec_;
  std::vector<at::Tensor> parameters_;
  gradient_reducer_actor reducer_;
  std::vector<std::vector<int64_t>> items_;  // segments per item
  std::vector<std::vector<Chunk>> chunks_;   // per item, in order
  std::vector<int64_t> item_of_;             // per parameter
  std::vector<int64_t> size_;                // per item: its parameters
  std::vector<at::Tensor> slots_;            // raw bytes, allocated once
  int64_t slot_bytes_ = 0;
  // One backward's progress (the reporting thread's alone).
  std::vector<char> ready_;
  std::vector<int64_t> missing_;
  size_t next_ = 0;
  bool active_ = false;
  SlotRing ring_;  // the free slots, shared with the reducer
};

}  // namespace tessera::actors
