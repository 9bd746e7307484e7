// An OptimizerKernel applies one optimizer update to a 1-D run of parameters (a ZeRO partition,
// or one sub-group of it) from that run's gradient and optimizer states. It holds no state: the
// states are passed in by whoever owns them (the optimizer-shard's state store), so the same
// kernel serves every flat group and sub-group, and offload can swap states in and out between
// calls. Temporaries come from a Workspace the caller owns and reuses: a step allocates nothing
// big in the steady state.
//
// Every update is elementwise and repeats LibTorch 1.13's torch::optim::<Kind>::step() for one
// parameter operation for operation (same ATen ops, scalar types and order, only written into
// preallocated outputs), so updating slices of a flat buffer gives the same bits as torch::optim
// updating the parameters whole (tests/optim checks this, sub-groups included). Adam/AdamW on fp32
// runs without amsgrad goes through the fused kernel (fused_adam.h), which gives those same bits.
//
// Example: 10 parameters of 1,000 elements at DP 4 (2,500 per rank) with sub-groups of 1,000:
// rank 1 calls step() three times per update, on elements [2500, 3500), [3500, 4500), [4500,
// 5000) with the matching slices of its "exp_avg"/"exp_avg_sq" partitions and `step` = the
// update's number (1 for the first).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/optim/optimizer_options.h"

namespace tessera::optim {

// Values a schedule may change from step to step (OneCycle also cycles the betas).
struct StepHyperparameters {
  double lr = 0.0;
  double beta1 = 0.0;
  double beta2 = 0.0;
};

// Reusable temporaries: slot k holds a buffer that grows to the largest request it has seen and
// is never shrunk. Owned by one thread (the optimizer-shard's).
class Workspace {
 public:
  // The first `elements` elements of slot `slot`, with `options` (dtype, device).
  at::Tensor get(size_t slot, int64_t elements, const at::TensorOptions& options);
  int64_t allocations() const { return allocations_; }  // buffers allocated so far (tests, benches)
  int64_t bytes() const;                                 // every slot's buffer

 private:
  std::vector<at::Tensor> slots_;
  int64_t allocations_ = 0;
};

class OptimizerKernel {
 public:
  virtual ~OptimizerKernel() = default;

  // The names of the per-element states, in a fixed order ("exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;
  // The states of a run like `param` as before the first update (zeros; Adagrad's initial
  // accumulator), in bf16 when options().bf16_states.
  virtual std::vector<at::Tensor> initial_states(const at::Tensor& param) const;
  // One update of `param` in place from `grad` (1-D, same length and dtype; already averaged,
  // unscaled and clipped), `states` (as initial_states made them, updated in place) and `step`
  // (this update's number, 1 for the first). Throws tessera::Error on mismatched inputs before
  // changing anything.
  virtual void step(const at::Tensor& param, const at::Tensor& grad, const std::vector<at::Tensor>& states,
                    int64_t step, const StepHyperparameters& hp, Workspace& workspace) const = 0;

  // Whether step() must see a flat group's whole partition at once (a kernel that keeps state
  // of its own); otherwise the caller may step any cut into sub-groups.
  virtual bool whole_partition() const { return false; }

  const OptimizerOptions& options() const { return options_; }
  // The hyperparameters a step uses when no schedule overrides them.
  StepHyperparameters default_hyperparameters() const { return {options_.lr, options_.beta1, options_.beta2}; }

 protected:
  explicit OptimizerKernel(const OptimizerOptions& options) : options_(options) {}
  // Throws unless param, grad and states agree in length (and param and grad in dtype).
  void check_inputs(const at::Tensor& param, const at::Tensor& grad, const std::vector<at::Tensor>& states,
                    const char* kind) const;
  OptimizerOptions options_;
};

// Validates `options` (throws tessera::ConfigError naming the field) and makes the kernel.
std::unique_ptr<OptimizerKernel> make_optimizer_kernel(const OptimizerOptions& options);

}  // namespace tessera::optim
