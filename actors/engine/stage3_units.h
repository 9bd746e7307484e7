// How a stage-3 initialize finds its units: the leaf modules (marked, configured, DeepSpeed's
// default classes), each trainable parameter's unit module (its owner, or the owner's outermost
// leaf ancestor), and the unit modules themselves, every one of which a tessera::Unit holder must
// call (or a stock Sequential's entry that the engine brackets itself, core/zero/sequential_units.h).
// Each refuses, before the model changes, what stage 3 cannot take (tied parameters, unheld
// units, unknown leaf names).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.h"
#include "core/zero/sequential_units.h"
#include "core/zero/sharding_plan.h"

namespace torch::nn {
class Module;
}

namespace tessera::actors {

std::set<std::string> stage3_leaf_modules(torch::nn::Module& model, const config::Config& config);
// Sets planned[i].module for each trainable parameter i.
void assign_stage3_units(torch::nn::Module& model, const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                         const std::set<std::string>& leaves, std::vector<zero::PlannedParameter>& planned);
struct Stage3UnitModules {
  std::vector<const torch::nn::Module*> modules;      // per plan unit
  std::unique_ptr<zero::SequentialUnits> sequential;  // the swapped Sequential entries (undone when it goes)
};
// Refuses (with the Sequential entries back as they were) a unit that neither a holder nor a
// Sequential calls.
Stage3UnitModules stage3_unit_modules(torch::nn::Module& model, const zero::ShardingPlan& plan);

}  // namespace tessera::actors
