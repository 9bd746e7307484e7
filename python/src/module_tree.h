// A Python torch.nn.Module seen by the C++ engine: a torch::nn::Module tree whose parameters are
// the Python module's own Parameter objects (the same TensorImpls, not copies), one submodule per
// dotted prefix. The engine's set_data() then rewires the Python parameters in place: after
// initialize, the user's model.parameters() are views of the engine's flat buffers.
//
// Every module of the tree is noted as held (core/zero/unit_hooks.h): at ZeRO-3 the Python
// module's forward hooks make the calls a C++ unit holder makes (python/tessera/_zero3.py).
//
// Example: [("0.weight", w), ("0.bias", b), ("2.weight", v)] -> a root with children "0" (weight,
// bias) and "2" (weight); named_parameters() gives the same names in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tessera::python {

// `parameters` in the Python module's named_parameters() order (each tensor once). A name with an
// empty part, or given twice, is a ConfigError naming it.
std::shared_ptr<torch::nn::Module> module_tree(const std::vector<std::pair<std::string, at::Tensor>>& parameters);

}  // namespace tessera::python
