// UnitGradStaging turns ZeRO-3 gradients into reduce-scatters in a fixed order. The order is the
// reverse of the plan's units (backward usually runs the model backwards), then each flat group's
// persistent segment (its parameters, biases and norms all over the model, are complete only at
// the end). As a parameter's gradient becomes final (take), the item it belongs to counts down;
// whenever the next item in the order is complete it is staged: each segment's gradients are
// copied into a fresh buffer laid out like the gathered segment (padding zero, a parameter
// without gradient zero), the parameters' .grad are dropped, and the buffers go to the
// gradient-reducer (segments message), which reduce-scatters them into the partition. A
// complete item out of order keeps its .grad until its turn; take_rest() at the end of backward
// stages everything left, in order. So every rank issues the same reductions in the same order,
// whatever order autograd reports gradients in.
//
// Threads: start(), take() and take_rest() run on autograd's thread (or the user's thread for a
// coalesced reduction), one backward at a time; nothing is shared.
//
// Memory: each item's buffers live from staging until its reduce-scatter finished (the reducer
// holds them); an item out of order keeps its parameters' full .grad until its turn.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "actors/engine_spec.h"
#include "actors/protocol.h"

namespace tessera::actors {

class UnitGradStaging {
 public:
  UnitGradStaging(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters);
  void connect(gradient_reducer_actor reducer) { reducer_ = std::move(reducer); }

  void start();              // a reducing backward begins
  void take(int64_t param);  // parameter `param`'s gradient is final for this backward
  void take_rest();          // backward ended: every item not staged yet, in order

 private:
  void stage(size_t item);
  void issue_ready();

  std::shared_ptr<const EngineSpec> spec_;
  std::vector<at::Tensor> parameters_;
  gradient_reducer_actor reducer_;
  std::vector<std::vector<int64_t>> items_;  // segments per item
  std::vector<int64_t> item_of_;             // per parameter
  std::vector<int64_t> size_;                // per item: its parameters
  // One backward's progress.
  std::vector<char> ready_;
  std::vector<int64_t> missing_;
  size_t next_ = 0;
  bool active_ = false;
};

}  // namespace tessera::actors
