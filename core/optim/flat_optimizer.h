// A FlatOptimizer updates one flat partition of fp32 master weights from its gradient, and owns
// the per-element optimizer states of that partition (Adam: exp_avg, exp_avg_sq).
//
// ZeRO gives each data-parallel rank a contiguous slice of the concatenated parameters; the
// optimizer only ever sees that slice as one 1-D tensor. Every update is elementwise and follows
// LibTorch's torch::optim operation for operation, so updating the slices of a flat buffer gives
// the same bits as torch::optim updating the parameters whole (tests/optim checks this).
//
// Example: 10 params of 1,000 elements at DP=4 with padding to 10,000 / 4 = 2,500 per rank:
// rank 1 holds a FlatOptimizer over elements [2500, 5000); after step() its "exp_avg" state is a
// 2,500-element tensor whose element i belongs to global flat element 2500 + i.
#pragma once

#include <ATen/core/Tensor.h>

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

class FlatOptimizer {
 public:
  virtual ~FlatOptimizer() = default;

  // One update of `param` in place from `grad` (both 1-D, same length and dtype; grad already
  // averaged, unscaled and clipped). States are created as zeros on the first step.
  virtual void step(const at::Tensor& param, const at::Tensor& grad, const StepHyperparameters& hp) = 0;

  // The names of the per-element states, in a fixed order ("exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;

  // The state tensors in state_names() order (undefined tensors before the first step).
  virtual std::vector<at::Tensor> states() const = 0;

  // Replaces the states (checkpoint load, reshard); each must match the partition's length.
  virtual void load_states(const std::vector<at::Tensor>& states, int64_t steps_taken) = 0;

  // Number of steps applied so far (Adam's bias correction uses it).
  int64_t steps_taken() const { return steps_taken_; }
  const OptimizerOptions& options() const { return options_; }
  // The hyperparameters a step uses when no schedule overrides them.
  StepHyperparameters default_hyperparameters() const { return {options_.lr, options_.beta1, options_.beta2}; }

 protected:
  explicit FlatOptimizer(const OptimizerOptions& options) : options_(options) {}
  OptimizerOptions options_;
  int64_t steps_taken_ = 0;
};

// Validates `options` (throws tessera::ConfigError naming the field) and makes the optimizer.
std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerOptions& options);

}  // namespace tessera::optim
