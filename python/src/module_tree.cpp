#include "python/src/module_tree.h"

#include <torch/nn/module.h>

#include "core/error.h"
#include "core/zero/unit_hooks.h"

namespace tessera::python {

std::shared_ptr<torch::nn::Module> module_tree(const std::vector<std::pair<std::string, at::Tensor>>& parameters) {
  auto root = std::make_shared<torch::nn::Module>("PythonModule");
  zero::note_held(root);
  for (const auto& [name, tensor] : parameters) {
    std::vector<std::string> parts;
    for (size_t begin = 0;;) {
      const size_t dot = name.find('.', begin);
      parts.push_back(name.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
      if (dot == std::string::npos) break;
      begin = dot + 1;
    }
    for (const auto& part : parts)
      if (part.empty()) throw ConfigError("initialize: parameter name '" + name + "' has an empty part");
    auto module = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto children = module->named_children();
      if (const auto* child = children.find(parts[i])) module = *child;
      else {
        module = module->register_module(parts[i], std::make_shared<torch::nn::Module>(parts[i]));
        zero::note_held(module);  // the Python module's forward hooks call it (a ZeRO-3 unit)
      }
    }
    if (module->named_parameters(/*recurse=*/false).contains(parts.back()))
      throw ConfigError("initialize: parameter '" + name + "' is given twice");
    // register_parameter keeps the tensor handle (the Python Parameter's TensorImpl).
    module->register_parameter(parts.back(), tensor, tensor.requires_grad());
  }
  return root;
}

}  // namespace tessera::python
