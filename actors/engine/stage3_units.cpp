#include "actors/engine/stage3_units.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/zero/leaf_modules.h"
#include "core/zero/unit_hooks.h"

namespace tessera::actors {

// ZeRO-3 leaf modules: the marked ones, the config's zero_optimization.leaf_module and DeepSpeed's
// default classes (leaf_modules.h).
std::set<std::string> stage3_leaf_modules(torch::nn::Module& model, const config::Config& config) {
  const auto& leaf = config.zero_optimization.leaf_module;
  const auto where = (config.source.empty() ? std::string() : config.source + ": ") + "zero_optimization.leaf_module.names";
  auto modules = model.named_modules();
  for (const auto& n : leaf.names)
    if (!modules.contains(n)) throw ConfigError(where + ": the model has no module '" + n + "'");
  std::set<std::string> out;
  auto classes = leaf.classes;
  for (const auto& c : default_z3_leaf_classes()) classes.push_back(c);
  for (const auto& item : modules) {
    const auto& name = item.key();
    bool is_leaf = z3_leaf_module(*item.value()) ||
                   std::find(leaf.names.begin(), leaf.names.end(), name) != leaf.names.end();
    for (const auto& c : classes) is_leaf = is_leaf || z3_class_matches(c, item.value()->name());
    for (const auto& s : leaf.name_suffixes) is_leaf = is_leaf || z3_suffix_matches(s, name);
    if (is_leaf) out.insert(name);
  }
  return out;
}

// ZeRO-3: each trainable parameter's unit is the module that registered it, or that module's
// outermost leaf ancestor. A parameter registered by two modules (tied weights, in different
// units) stays gathered (persistent): either module's forward may come first.
void assign_stage3_units(torch::nn::Module& model, const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                  const std::set<std::string>& leaves, std::vector<zero::PlannedParameter>& planned) {
  std::map<const c10::TensorImpl*, std::vector<std::string>> owners;  // every module registering it, model order
  for (const auto& item : model.named_modules())
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      owners[p.value().unsafeGetTensorImpl()].push_back(item.key());
  auto outermost_leaf = [&](const std::string& module) {
    if (leaves.count("")) return std::string();
    for (size_t at = module.find('.'); ; at = module.find('.', at + 1)) {
      const auto prefix = at == std::string::npos ? module : module.substr(0, at);
      if (leaves.count(prefix)) return prefix;
      if (at == std::string::npos) return module;
    }
  };
  for (size_t i = 0; i < trainable.size(); ++i) {
    const auto& mine = owners.at(trainable[i].second.unsafeGetTensorImpl());
    planned[i].module = outermost_leaf(mine.front());
    for (const auto& other : mine)
      if (outermost_leaf(other) != planned[i].module) planned[i].persistent = true;
  }
}

// ZeRO-3: the modules of the plan's units, each of which a tessera::Unit holder or a Sequential
// (whose entries are swapped here, even when a holder holds them: Sequential calls the module, not
// the holder) must call.
Stage3UnitModules stage3_unit_modules(torch::nn::Module& model, const zero::ShardingPlan& plan) {
  std::map<std::string, const torch::nn::Module*> by_name;
  for (const auto& item : model.named_modules()) by_name[item.key()] = item.value().get();
  Stage3UnitModules out;
  for (const auto& unit : plan.units()) out.modules.push_back(by_name.at(unit.module));
  out.sequential = std::make_unique<zero::SequentialUnits>(model, out.modules);
  std::vector<std::string> unheld;
  for (size_t u = 0; u < plan.units().size(); ++u) {
    const auto& unit = plan.units()[u];
    const auto* m = out.modules[u];
    if (!zero::is_held(m) && !out.sequential->brackets(m)) unheld.push_back("'" + (unit.module.empty() ? std::string("(the root module)") : unit.module) + "' (" + m->name() + ")");
  }
  if (!unheld.empty()) {
    std::string list;
    for (size_t i = 0; i < unheld.size() && i < 6; ++i) list += (i ? ", " : "") + unheld[i];
    if (unheld.size() > 6) list += " and " + std::to_string(unheld.size() - 6) + " more";
    throw Error("initialize: ZeRO-3 gathers a module's parameters around its forward, which it can only see through a "
                "tessera::Unit holder (core/zero/unit_holder.h) or as an entry of a torch::nn::Sequential; these modules "
                "own parameters but neither calls them: " + list + ". Declare the member as tessera::Unit<torch::nn::Linear> (etc.) instead of "
                "torch::nn::Linear, or raise zero_optimization.stage3_param_persistence_threshold to keep them gathered");
  }
  return out;
}

}  // namespace tessera::actors
