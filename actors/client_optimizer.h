// ClientStepKernel runs a client torch::optim optimizer that tessera does not translate (RMSprop,
// a user's own subclass) on one flat group's partition, by calling the client's own step(): the
// client's param groups are emptied at initialize, and the first update adds one alias of the
// partition (its fp32 master, or the flat parameters) to the client group it came from. An update
// gives the alias the partition's gradient, sets the group's lr from the schedule, calls step()
// and takes the gradient back; torch::optim skips parameters without a gradient, so the other
// flat groups are untouched.
//
// The one kernel that keeps state: the client's own (torch::optim state keyed by the alias), so
// it steps the whole partition at once (whole_partition()), its states are not tessera's and are
// not in storage maps. Elementwise optimizers give the same bits on a partition as on the whole
// parameters; one that looks across elements (a norm per tensor, LBFGS) would not, and is the
// caller's responsibility.
#pragma once

#include <memory>
#include <string>

#include "core/optim/optimizer_kernel.h"

namespace torch::optim {
class Optimizer;
}

namespace tessera::actors {

class ClientStepKernel : public optim::OptimizerKernel {
 public:
  ClientStepKernel(std::shared_ptr<torch::optim::Optimizer> client, size_t client_group,
                   const optim::OptimizerOptions& options);
  std::vector<std::string> state_names() const override { return {}; }
  std::vector<at::Tensor> initial_states(const at::Tensor&) const override { return {}; }
  bool whole_partition() const override { return true; }
  void step(const at::Tensor& param, const at::Tensor& grad, const std::vector<at::Tensor>& states, int64_t step,
            const optim::StepHyperparameters& hp, optim::Workspace& workspace) const override;

 private:
  std::shared_ptr<torch::optim::Optimizer> client_;
  size_t client_group_;
  mutable at::Tensor alias_;  // the partition as the client knows it (its state is keyed by this tensor)
};

// Empties the client's param groups (they name the model's parameters, which the engine replaced
// by flat partitions); call once, before the first ClientStepKernel step.
void detach_client_parameters(torch::optim::Optimizer& client);

}  // namespace tessera::actors
