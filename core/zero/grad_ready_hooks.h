// GradReadyHooks reports "this parameter's gradient is complete for this backward" from inside
// autograd, with post-hooks on each parameter's pinned AccumulateGrad node.
//
// A post-hook of AccumulateGrad runs after the gradient was accumulated into .grad, once per
// backward per parameter, even when the parameter is used several times in the graph (the
// engine sums its inputs first). The nodes are pinned here: a parameter holds only a weak_ptr
// to its accumulator, and an unpinned one dies with the graph (a weak_ptr in LibTorch's AutogradMeta).
// A second callback runs once at the end of every backward that fired at least one hook.
//
// Callbacks run on autograd's thread, in autograd's order (which differs between ranks); users
// that issue collectives must turn it into a fixed order first (docs/DESIGN.md §7.3).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace tessera::zero {

class GradReadyHooks {
 public:
  using ReadyCallback = std::function<void(int64_t param_index)>;
  using BackwardEndCallback = std::function<void()>;

  // Installs the hooks. The parameters must be leaves that require grad, full-shaped.
  GradReadyHooks(const std::vector<at::Tensor>& parameters, ReadyCallback on_ready, BackwardEndCallback on_end);
  // Disarms the hooks (LibTorch cannot remove a node's post-hook; they become no-ops).
  ~GradReadyHooks();
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;

  struct State;  // shared with the hooks; outlives this object while autograd holds hooks

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessera::zero
