// ClientStepOptimizer runs a client torch::optim optimizer that tessera does not translate
// (RMSprop, a user's own subclass) on one flat group's partition, by calling the client's own
// step(): the client's param groups are emptied at initialize, and the first update of each flat
// group adds one alias of that group's partition (its fp32 master, or the flat parameters) to the
// client group it came from. An update gives the alias the partition's gradient, sets the
// group's lr from the schedule, calls step() and takes the gradient back; torch::optim skips
// parameters without a gradient, so the other flat groups are untouched.
//
// Elementwise optimizers give the same bits on a partition as on the whole parameters; an
// optimizer that looks across elements (a norm per tensor, LBFGS) would not, and is the caller's
// responsibility. Its states are the client's own: not described in storage maps.
#pragma once

#include <memory>
#include <string>

#include "core/optim/flat_optimizer.h"

namespace torch::optim {
class Optimizer;
}

namespace tessera::actors {

class ClientStepOptimizer : public optim::FlatOptimizer {
 public:
  ClientStepOptimizer(std::shared_ptr<torch::optim::Optimizer> client, size_t client_group,
                      const optim::OptimizerOptions& options);
  void step(const at::Tensor& param, const at::Tensor& grad, const optim::StepHyperparameters& hp) override;
  std::vector<std::string> state_names() const override { return {}; }
  std::vector<at::Tensor> states() const override { return {}; }
  void load_states(const std::vector<at::Tensor>& states, int64_t steps_taken) override;

 private:
  std::shared_ptr<torch::optim::Optimizer> client_;
  size_t client_group_;
  at::Tensor alias_;  // the partition as the client knows it (its state is keyed by this tensor)
};

// Empties the client's param groups (they name the model's parameters, which the engine replaced
// by flat partitions); call once, before the first ClientStepOptimizer step.
void detach_client_parameters(torch::optim::Optimizer& client);

}  // namespace tessera::actors
