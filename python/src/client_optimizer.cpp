#include "python/src/client_optimizer.h"

#include <pybind11/stl.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/python.h>

#include "core/error.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

// A group's setting; the Python side fills every key its class has, so a missing one is a defect
// there, still named.
double setting(const ClientGroup& group, size_t g, const std::string& key) {
  auto it = group.settings.find(key);
  if (it == group.settings.end())
    throw ConfigError("initialize: the client optimizer's param group " + std::to_string(g) + " has no '" + key + "'");
  return it->second;
}

// Adam and AdamW take the same settings under the same names.
template <typename Options, typename Get>
std::unique_ptr<torch::optim::OptimizerOptions> adam_options(const Get& get) {
  return std::make_unique<Options>(Options(get("lr"))
                                       .betas({get("beta1"), get("beta2")})
                                       .eps(get("eps"))
                                       .weight_decay(get("weight_decay"))
                                       .amsgrad(get("amsgrad") != 0));
}

std::unique_ptr<torch::optim::OptimizerOptions> translated_options(ClientKind kind, const ClientGroup& group, size_t g) {
  auto get = [&](const char* key) { return setting(group, g, key); };
  switch (kind) {
    case ClientKind::Adam:
      return adam_options<torch::optim::AdamOptions>(get);
    case ClientKind::AdamW:
      return adam_options<torch::optim::AdamWOptions>(get);
    case ClientKind::SGD:
      return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(get("lr"))
                                                            .momentum(get("momentum"))
                                                            .dampening(get("dampening"))
                                                            .weight_decay(get("weight_decay"))
                                                            .nesterov(get("nesterov") != 0));
    case ClientKind::Adagrad:
      return std::make_unique<torch::optim::AdagradOptions>(torch::optim::AdagradOptions(get("lr"))
                                                                .lr_decay(get("lr_decay"))
                                                                .weight_decay(get("weight_decay"))
                                                                .initial_accumulator_value(get("initial_accumulator_value"))
                                                                .eps(get("eps")));
    case ClientKind::PythonStep:
      break;
  }
  throw Error("client optimizer: no translation for this kind");
}

// The settings the engine needs of a group it does not translate: its lr (the schedule sets it).
class PythonStepOptions : public torch::optim::OptimizerCloneableOptions<PythonStepOptions> {
 public:
  explicit PythonStepOptions(double lr) : lr_(lr) {}
  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }

 private:
  double lr_;
};

// The client's groups as the engine sees them; step() hands the partitions the engine put in them
// (with their gradients) and the groups' lrs to the Python callback, which runs the client's step().
class PythonStepOptimizer : public torch::optim::Optimizer {
 public:
  PythonStepOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups, py::object python_step)
      : Optimizer(std::move(groups), std::make_unique<PythonStepOptions>(0.0)), python_step_(std::move(python_step)) {}
  ~PythonStepOptimizer() override {
    // Freed on an actor's thread after the interpreter began to finalise (an engine kept alive by a
    // reference cycle, collected at exit): taking the GIL there ends the thread inside this destructor
    // (std::terminate). The callable is left to the exiting interpreter instead.
    if (!PyGILState_Check() && _Py_IsFinalizing()) {
      python_step_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    python_step_ = py::object();
  }

  at::Tensor step(LossClosure) override {
    py::gil_scoped_acquire gil;  // called from the engine's step(), which released it
    try {
      py::list groups, lrs;
      for (auto& group : param_groups()) {
        py::list params;
        for (const auto& p : group.params()) params.append(py::cast(p));
        groups.append(params);
        lrs.append(group.options().get_lr());
      }
      python_step_(groups, lrs);
    } catch (py::error_already_set& e) {
      throw Error(std::string("the client optimizer's step() raised: ") + e.what());
    }
    return {};
  }

 private:
  py::object python_step_;
};

}  // namespace

std::shared_ptr<torch::optim::Optimizer> client_optimizer(ClientKind kind, const std::vector<ClientGroup>& groups,
                                                          const torch::nn::Module& tree, py::object python_step) {
  const auto parameters = tree.named_parameters();
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> params;
    for (const auto& name : groups[g].names) {
      const auto* p = parameters.find(name);
      if (!p)
        throw ConfigError("initialize: the client optimizer's param group " + std::to_string(g) + " names '" + name +
                          "', which is not a parameter of the model");
      params.push_back(*p);
    }
    auto options = kind == ClientKind::PythonStep
                       ? std::unique_ptr<torch::optim::OptimizerOptions>(
                             std::make_unique<PythonStepOptions>(setting(groups[g], g, "lr")))
                       : translated_options(kind, groups[g], g);
    param_groups.emplace_back(std::move(params), std::move(options));
  }
  if (param_groups.empty()) throw ConfigError("initialize: the client optimizer has no param groups");
  switch (kind) {
    case ClientKind::Adam:
      return std::make_shared<torch::optim::Adam>(std::move(param_groups));
    case ClientKind::AdamW:
      return std::make_shared<torch::optim::AdamW>(std::move(param_groups));
    case ClientKind::SGD:
      return std::make_shared<torch::optim::SGD>(std::move(param_groups), torch::optim::SGDOptions(0));
    case ClientKind::Adagrad:
      return std::make_shared<torch::optim::Adagrad>(std::move(param_groups));
    case ClientKind::PythonStep:
      return std::make_shared<PythonStepOptimizer>(std::move(param_groups), std::move(python_step));
  }
  throw Error("client optimizer: unknown kind");
}

}  // namespace tessera::python
