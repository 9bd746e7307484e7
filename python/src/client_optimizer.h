// A client torch.optim optimizer given from Python, handed to the C++ engine as the C++ API takes
// one (InitializeOptions::optimizer): Adam, AdamW, SGD and Adagrad become the torch::optim class
// of the same name over the C++ tree's parameters, with each group's settings, so the engine
// translates them to its flat optimizers exactly as it does a C++ client's; any other class
// becomes a PythonStepOptimizer, whose step() calls back into Python, where the client's own
// step() runs on the flat partitions (actors/client_optimizer.h gives them to it as parameters).
//
// The Python side (python/tessera/_optimizer.py) reads the groups and refuses settings that have
// no flat equivalent (maximize, capturable, ...); this side refuses a group that lacks a setting
// its class needs, naming the group and the key.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace tessera::python {

enum class ClientKind { Adam, AdamW, SGD, Adagrad, PythonStep };

struct ClientGroup {
  std::vector<std::string> names;           // the group's parameters by dotted name in the tree
  std::map<std::string, double> settings;   // lr, beta1, beta2, eps, weight_decay, amsgrad, ... (bools as 0/1)
};

// The optimizer the engine takes. `python_step(groups, lrs)` (PythonStep only) is called with the
// GIL held at every update: groups[g] are the partitions of client group g as tensors with their
// gradients set, lrs[g] its lr from the schedule.
std::shared_ptr<torch::optim::Optimizer> client_optimizer(ClientKind kind, const std::vector<ClientGroup>& groups,
                                                          const torch::nn::Module& tree, pybind11::object python_step);

}  // namespace tessera::python
