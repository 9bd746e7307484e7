#include "actors/engine/group_resolution.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <c10/util/Type.h>

#include <algorithm>
#include <map>
#include <optional>

#include "core/error.h"

namespace tessera::actors {
namespace {

// The flat-optimizer settings of one torch::optim group's options; nullopt for other classes.
std::optional<optim::OptimizerOptions> translate(const torch::optim::OptimizerOptions& o) {
  optim::OptimizerOptions out;
  if (const auto* a = dynamic_cast<const torch::optim::AdamWOptions*>(&o)) {
    out.kind = optim::OptimizerKind::AdamW;
    out.lr = a->lr(), out.beta1 = std::get<0>(a->betas()), out.beta2 = std::get<1>(a->betas());
    out.eps = a->eps(), out.weight_decay = a->weight_decay(), out.amsgrad = a->amsgrad();
  } else if (const auto* a = dynamic_cast<const torch::optim::AdamOptions*>(&o)) {
    out.kind = optim::OptimizerKind::Adam;
    out.lr = a->lr(), out.beta1 = std::get<0>(a->betas()), out.beta2 = std::get<1>(a->betas());
    out.eps = a->eps(), out.weight_decay = a->weight_decay(), out.amsgrad = a->amsgrad();
  } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&o)) {
    out.kind = optim::OptimizerKind::SGD;
    out.lr = sgd->lr(), out.momentum = sgd->momentum(), out.dampening = sgd->dampening();
    out.weight_decay = sgd->weight_decay(), out.nesterov = sgd->nesterov();
  } else if (const auto* ada = dynamic_cast<const torch::optim::AdagradOptions*>(&o)) {
    out.kind = optim::OptimizerKind::Adagrad;
    out.lr = ada->lr(), out.lr_decay = ada->lr_decay(), out.weight_decay = ada->weight_decay();
    out.initial_accumulator_value = ada->initial_accumulator_value(), out.eps = ada->eps();
  } else {
    return std::nullopt;
  }
  return out;
}

std::string group_label(size_t g) { return "param group " + std::to_string(g); }

}  // namespace

std::vector<ResolvedGroup> resolve_groups(const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                                          const std::vector<ParamGroup>& groups,
                                          const torch::optim::Optimizer* client,
                                          const std::optional<optim::OptimizerOptions>& config_options) {
  if (client && config_options)
    throw ConfigError("initialize: both a client optimizer and an `optimizer` config section were given; "
                      "remove one (tessera does not pick one silently)");
  if (client && !groups.empty())
    throw ConfigError("initialize: param_groups and a client optimizer were both given; the client optimizer's "
                      "param groups define the groups");
  if (!client && !config_options)
    throw ConfigError("optimizer: the engine needs an `optimizer` section (type and params) or a client optimizer");

  std::map<const void*, int64_t> by_impl;     // trainable parameter -> index
  std::map<std::string, int64_t> by_name;
  for (size_t i = 0; i < trainable.size(); ++i) {
    by_impl[trainable[i].second.unsafeGetTensorImpl()] = int64_t(i);
    by_name[trainable[i].first] = int64_t(i);
  }
  std::vector<int64_t> owner(trainable.size(), -1);
  std::vector<ResolvedGroup> out;
  // Adds a parameter to group g (skips frozen ones; refuses strangers and duplicates).
  auto claim = [&](size_t g, int64_t index, const std::string& what) {
    if (index < 0) return;
    if (owner[index] >= 0)
      throw ConfigError("initialize: parameter '" + trainable[index].first + "' is in " + group_label(owner[index]) +
                        " and in " + group_label(g) + " (" + what + ")");
    owner[index] = int64_t(g);
    out[g].params.push_back(index);
  };
  auto index_of = [&](const at::Tensor& t, size_t g) -> int64_t {
    if (!t.defined()) throw ConfigError("initialize: " + group_label(g) + " holds an undefined tensor");
    auto it = by_impl.find(t.unsafeGetTensorImpl());
    if (it != by_impl.end()) return it->second;
    if (!t.requires_grad()) return -1;  // a frozen parameter: not trained, as the default group
    throw ConfigError("initialize: " + group_label(g) + " holds a tensor of shape " + c10::str(t.sizes()) +
                      " that is not a parameter of the model");
  };

  if (client) {
    const auto& client_groups = client->param_groups();
    // torch::optim::Adagrad makes a step-0 state for every parameter when it is built: not a used optimizer.
    const auto used = std::count_if(client->state().begin(), client->state().end(), [](const auto& entry) {
      const auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(entry.second.get());
      return !adagrad || adagrad->step() != 0;
    });
    if (used > 0)
      throw ConfigError("initialize: the client optimizer already holds state for " + std::to_string(used) +
                        " parameters; pass a fresh optimizer");
    for (size_t g = 0; g < client_groups.size(); ++g) {
      const auto& options = client_groups[g].options();
      ResolvedGroup group;
      if (auto translated = translate(options)) {
        group.options = *translated;
      } else {
        group.client_step = true;
        group.client_class = c10::demangle(typeid(*client).name());
        group.options.lr = options.get_lr();
      }
      out.push_back(group);
      if (out[g].client_step != out[0].client_step || out[g].options.kind != out[0].options.kind)
        throw ConfigError("initialize: the client optimizer's groups mix optimizer types");
      for (const auto& p : client_groups[g].params()) claim(g, index_of(p, g), "client optimizer");
    }
  } else if (groups.empty()) {
    out.push_back({{}, *config_options});
    for (size_t i = 0; i < trainable.size(); ++i) claim(0, int64_t(i), "");
  } else {
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& pg = groups[g];
      auto o = *config_options;
      if (pg.lr) o.lr = *pg.lr;
      if (pg.weight_decay) o.weight_decay = *pg.weight_decay;
      if (pg.eps) o.eps = *pg.eps;
      if (pg.beta1) o.beta1 = *pg.beta1;
      if (pg.beta2) o.beta2 = *pg.beta2;
      if (pg.momentum) o.momentum = *pg.momentum;
      out.push_back({{}, o});
      for (const auto& t : pg.params) claim(g, index_of(t, g), "params");
      for (const auto& name : pg.names) {
        auto it = by_name.find(name);
        if (it == by_name.end())
          throw ConfigError("initialize: " + group_label(g) + " names '" + name +
                            "', which is not a trainable parameter of the model");
        claim(g, it->second, "names");
      }
    }
  }
  for (size_t i = 0; i < trainable.size(); ++i)
    if (owner[i] < 0)
      throw ConfigError("initialize: parameter '" + trainable[i].first +
                        "' requires grad but is in no param group; add it to one or set requires_grad(false)");
  for (size_t g = 0; g < out.size(); ++g) {
    if (out[g].params.empty())
      throw ConfigError("initialize: " + group_label(g) + " has no trainable parameter");
    std::sort(out[g].params.begin(), out[g].params.end());
  }
  return out;
}

}  // namespace tessera::actors
