// Resolves which trainable parameters form each parameter group and the optimizer settings of
// each, from one of three sources: nothing (one group, the config's optimizer), the user's
// ParamGroup list over the config's optimizer, or a client torch::optim optimizer (its type and
// its groups' options; the config must then have no optimizer section). Every problem is an
// Error naming the parameter, group or option, raised before the engine changes anything.
//
// A client optimizer is translated where it can be: Adam, AdamW, SGD and Adagrad map to the flat
// optimizers that follow torch::optim operation for operation (results are the client class's
// bit for bit, and its states appear in storage maps); any other class is called on the flat
// partitions by its own step() (client_optimizer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/engine/param_group.h"
#include "core/optim/optimizer_options.h"

namespace torch::optim {
class Optimizer;
}

namespace tessera::actors {

struct ResolvedGroup {
  std::vector<int64_t> params;  // indices into the trainable parameters (model order), ascending
  optim::OptimizerOptions options;
  // A client optimizer of a class tessera does not translate: its own step() updates this group
  // (client_optimizer.h); options hold only its lr.
  bool client_step = false;
  std::string client_class;  // with client_step: the optimizer's C++ class, for errors
};

// `trainable`: the module's parameters that require grad, in model order. `config_options`: the
// config's optimizer (nullopt when it has none).
std::vector<ResolvedGroup> resolve_groups(const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                                          const std::vector<ParamGroup>& groups,
                                          const torch::optim::Optimizer* client,
                                          const std::optional<optim::OptimizerOptions>& config_options);

}  // namespace tessera::actors
