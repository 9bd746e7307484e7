// The C++ engine as the Python module holds it: the engine and the module tree whose parameters
// are the Python module's own tensors (module_tree.h). Shared by the engine's bindings
// (module.cpp) and the weight sync's (rollout_bindings.cpp).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "actors/engine/engine.h"

namespace tessera::python {

struct PyEngine {
  std::shared_ptr<torch::nn::Module> tree;
  std::shared_ptr<Engine> engine;
  std::map<std::string, const torch::nn::Module*> modules;  // the tree's modules by dotted prefix ("" the root)
};

}  // namespace tessera::python
