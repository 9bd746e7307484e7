// Autocast as the engine applies it (config section torch_autocast): forward runs under LibTorch's
// CPU autocast in bf16 while parameters, gradients and master stay fp32, and the gradients of
// parameters owned by "lower precision safe" module types (DeepSpeed's default: Linear, Conv1d,
// Conv2d, Conv3d) are reduced in bf16.
//
// Module types are matched by LibTorch's Module::name(): "torch.nn.Linear" (DeepSpeed's
// spelling) and "torch::nn::Linear" both name torch::nn::LinearImpl; a name without a namespace
// ("Block") matches a user module type of that name in any namespace.
#pragma once

#include <ATen/core/ScalarType.h>

#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tessera::actors {

// For each name in `parameter_names` (dotted, as model.named_parameters() gives them): whether
// the module that directly owns it has a type in `safe_modules`.
std::vector<bool> lower_precision_parameters(const torch::nn::Module& model,
                                             const std::vector<std::string>& parameter_names,
                                             const std::vector<std::string>& safe_modules);

// Sets LibTorch's CPU autocast for its lifetime (enabled in `dtype`, or disabled) and restores
// the previous state after; the outermost enabled guard clears autocast's weight cast cache.
class AutocastGuard {
 public:
  AutocastGuard(bool enabled, at::ScalarType dtype = at::kBFloat16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
  bool nested_;
};

}  // namespace tessera::actors
