#include "actors/client_optimizer.h"

#include <torch/optim/optimizer.h>

#include "core/error.h"

namespace tessera::actors {

ClientStepKernel::ClientStepKernel(std::shared_ptr<torch::optim::Optimizer> client, size_t client_group,
                                   const optim::OptimizerOptions& options)
    : OptimizerKernel(options), client_(std::move(client)), client_group_(client_group) {}

void ClientStepKernel::step(const at::Tensor& param, const at::Tensor& grad, const std::vector<at::Tensor>&, int64_t,
                            const optim::StepHyperparameters& hp, optim::Workspace&) const {
  if (param.numel() != grad.numel() || param.scalar_type() != grad.scalar_type())
    throw Error("client optimizer step: the gradient does not match the partition");
  if (!alias_.defined()) {
    alias_ = param.detach();  // shares the partition's memory: the client's updates land in it
    client_->param_groups().at(client_group_).params().push_back(alias_);
  } else if (alias_.data_ptr() != param.data_ptr() || alias_.numel() != param.numel()) {
    throw Error("client optimizer step: the partition moved since the first step");
  }
  auto& group = client_->param_groups().at(client_group_);
  group.options().set_lr(hp.lr);
  alias_.mutable_grad() = grad;
  client_->step();
  alias_.mutable_grad() = at::Tensor();
}

void detach_client_parameters(torch::optim::Optimizer& client) {
  for (auto& group : client.param_groups()) group.params().clear();
}

}  // namespace tessera::actors
