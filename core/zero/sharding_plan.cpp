#include "core/zero/sharding_plan.h"

#include <algorithm>
#include <map>

#include "core/affine/builders.h"
#include "core/affine/zero_storage.h"
#include "core/error.h"

namespace tessera::zero {

int64_t PlannedParameter::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ShardingPlan::ShardingPlan(std::vector<PlannedParameter> parameters, const ShardingPlanOptions& options)
    : options_(options), parameters_(std::move(parameters)) {
  auto fail = [](const std::string& what) { throw Error("sharding plan: " + what); };
  if (parameters_.empty()) fail("no parameters");
  if (options_.stage < 0 || options_.stage > 2)
    fail("ZeRO stage " + std::to_string(options_.stage) + " (stages 0-2; ZeRO-3 units are not planned yet)");
  if (options_.world < 1) fail("data-parallel size " + std::to_string(options_.world) + " < 1");
  if (options_.bucket_elements < 1) fail("bucket size " + std::to_string(options_.bucket_elements) + " < 1 element");
  if (options_.sub_group_elements < 1)
    fail("sub-group size " + std::to_string(options_.sub_group_elements) + " < 1 element");
  int64_t param_groups = 0;
  for (const auto& p : parameters_) {
    if (p.param_group < 0) fail("parameter '" + p.name + "' has parameter group " + std::to_string(p.param_group));
    param_groups = std::max(param_groups, p.param_group + 1);
  }
  // Flat groups in (parameter group, lower precision) order: the storage keys "<kind>/<g>" and
  // the buckets' tie-break follow it.
  places_.resize(parameters_.size());
  std::vector<FlatGroupLayout> layouts;
  std::vector<std::vector<int64_t>> model_index;
  for (int64_t pg = 0; pg < param_groups; ++pg) {
    bool used = false;
    for (const bool low : {false, true}) {
      FlatGroupPlan group;
      group.param_group = pg;
      group.lower_precision = low;
      std::vector<std::string> names;
      std::vector<int64_t> numels;
      for (size_t i = 0; i < parameters_.size(); ++i) {
        if (parameters_[i].param_group != pg || parameters_[i].lower_precision != low) continue;
        places_[i] = {int64_t(groups_.size()), int64_t(group.params.size())};
        group.params.push_back(int64_t(i));
        names.push_back(parameters_[i].name);
        numels.push_back(parameters_[i].numel());
      }
      if (group.params.empty()) continue;
      used = true;
      group.layout = make_flat_group_layout(names, numels, partitions(), alignment());
      for (int64_t b = 0; b < group.layout.partition_numel; b += options_.sub_group_elements)
        group.sub_groups.push_back({b, std::min(group.layout.partition_numel, b + options_.sub_group_elements)});
      layouts.push_back(group.layout);
      model_index.push_back(group.params);
      groups_.push_back(std::move(group));
    }
    if (!used) fail("parameter group " + std::to_string(pg) + " has no parameter");
  }
  buckets_ = make_bucket_plan(layouts, model_index,
                              partitioned_gradients() ? BucketShape::reduce_to_owner : BucketShape::all_reduce,
                              options_.bucket_elements);
}

int64_t ShardingPlan::largest_sub_group() const {
  int64_t most = 0;
  for (const auto& g : groups_)
    for (const auto& s : g.sub_groups) most = std::max(most, s.elements());
  return most;
}

namespace {

affine::TensorInfo info_of(const PlannedParameter& p, affine::DType dtype) {
  return {p.name, dtype, affine::Dims(p.shape)};
}

}  // namespace

std::vector<affine::TensorMap> ShardingPlan::weight_maps(int64_t g, affine::DType dtype) const {
  const auto& group = groups_.at(size_t(g));
  std::map<int, int64_t> buffers;
  for (int r = 0; r < options_.world; ++r) buffers[r] = group.layout.padded_numel;
  std::vector<affine::TensorMap> out;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const auto& slot = group.layout.params[i];
    std::vector<affine::StoredRun> runs;
    for (int r = 0; r < options_.world; ++r) runs.push_back({r, 0, slot.numel, slot.offset});
    out.push_back(affine::stored_runs(info_of(parameters_[group.params[i]], dtype), runs, buffers));
  }
  return out;
}

std::vector<affine::TensorMap> ShardingPlan::partition_maps(int64_t g, affine::DType dtype) const {
  const auto& group = groups_.at(size_t(g));
  const auto& layout = group.layout;
  std::map<int, int64_t> buffers;
  std::vector<std::vector<affine::StoredRun>> runs(group.params.size());
  for (int r = 0; r < options_.world; ++r) {
    buffers[r] = layout.partition_numel;
    const int64_t owned = owned_partition(r);
    const int64_t base = layout.partition_begin(owned);
    for (const auto& f : layout.fragments(owned))
      runs[size_t(f.param_index)].push_back({r, f.param_begin, f.param_begin + f.length, f.flat_begin - base});
  }
  std::vector<affine::TensorMap> out;
  for (size_t i = 0; i < group.params.size(); ++i)
    out.push_back(affine::stored_runs(info_of(parameters_[group.params[i]], dtype), runs[i], buffers));
  return out;
}

}  // namespace tessera::zero
