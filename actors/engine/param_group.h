// A ParamGroup is one entry of DeepSpeed's `model_parameters` list of dicts: some of the model's
// parameters and the optimizer settings that differ for them from the config's optimizer.params.
//
//   std::vector<tessera::ParamGroup> groups(2);
//   groups[0].names = {"h.0.attn.c_attn.weight", ...};        // or .params = {tensor, ...}
//   groups[1].params = biases_and_norms;  groups[1].weight_decay = 0.0;
//   tessera::InitializeOptions options;  options.param_groups = groups;
//   auto [engine, optimizer, lr_scheduler] = tessera::initialize(model, config, options);
//
// Every trainable parameter must be in exactly one group; parameters that do not require grad
// are skipped. Each group is its own flat group (own padding and partitions, DeepSpeed's layout)
// and gets its own optimizer states; a schedule sets each group's lr as DeepSpeed's does
// (WarmupCosineLR scales each group's own lr, the others set one value for all groups).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct ParamGroup {
  std::vector<at::Tensor> params;   // the model's parameter tensors
  std::vector<std::string> names;   // and/or their dotted names in the module
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<double> eps;
  std::optional<double> beta1;
  std::optional<double> beta2;
  std::optional<double> momentum;   // SGD
};

}  // namespace tessera
