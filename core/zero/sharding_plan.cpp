#include "core/zero/sharding_plan.h"

#include <algorithm>
#include <limits>
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
  if (options_.stage < 0 || options_.stage > 3) fail("ZeRO stage " + std::to_string(options_.stage) + " (stages 0-3)");
  if (options_.world < 1) fail("data-parallel size " + std::to_string(options_.world) + " < 1");
  if (options_.stage != 3 && options_.bucket_elements < 0)  // stage 3 reduces per segment, without buckets
    fail("bucket size " + std::to_string(options_.bucket_elements) + " < 0 elements");
  if (options_.sub_group_elements < 1)
    fail("sub-group size " + std::to_string(options_.sub_group_elements) + " < 1 element");
  if (options_.persistence_threshold < 0)
    fail("persistence threshold " + std::to_string(options_.persistence_threshold) + " < 0 elements");
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
      layouts.push_back(group.layout);
      model_index.push_back(group.params);
      groups_.push_back(std::move(group));
    }
    if (!used) fail("parameter group " + std::to_string(pg) + " has no parameter");
  }
  if (options_.stage == 3) {
    std::vector<Stage3Parameter> inputs;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const auto& p = parameters_[i];
      inputs.push_back({p.name, p.module, p.numel(), places_[i].first,
                        p.persistent || p.numel() <= options_.persistence_threshold});
    }
    stage3_ = make_stage3_layout(inputs, int64_t(groups_.size()), options_.world, alignment());
    // A flat group keeps only its sizes: no buffer holds it whole at stage 3.
    for (size_t g = 0; g < groups_.size(); ++g) {
      auto& layout = groups_[g].layout;
      layout.params.clear();
      layout.partition_numel = stage3_.partition_numel[g];
      layout.padded_numel = layout.partition_numel * layout.dp_size;
      groups_[g].segments = stage3_.group_segments[g];
    }
    buckets_.shape = BucketShape::reduce_to_owner;
    buckets_.param_buckets.assign(parameters_.size(), {});
  }
  for (auto& group : groups_)
    for (int64_t b = 0; b < group.layout.partition_numel; b += options_.sub_group_elements)
      group.sub_groups.push_back({b, std::min(group.layout.partition_numel, b + options_.sub_group_elements)});
  if (options_.stage != 3) {
    const bool per_parameter = options_.bucket_elements == 0;
    const BucketCut cut = per_parameter ? BucketCut::per_parameter : BucketCut::by_size;
    const int64_t size = per_parameter ? std::numeric_limits<int64_t>::max() : options_.bucket_elements;
    buckets_ = partitioned_gradients()
                   ? make_bucket_plan(layouts, model_index, BucketShape::reduce_to_owner,
                                      std::min(size, kMaxStagedBucketElements), cut)
                   : make_bucket_plan(layouts, model_index, BucketShape::all_reduce, size, cut);
  }
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

std::pair<int64_t, int64_t> ShardingPlan::segment_place(int64_t param) const {
  if (param < 0 || size_t(param) >= parameters_.size())
    throw Error("sharding plan: parameter " + std::to_string(param) + " of " + std::to_string(parameters_.size()));
  return options_.stage == 3 ? stage3_.places[size_t(param)] : std::pair<int64_t, int64_t>{-1, -1};
}

bool ShardingPlan::persistent(int64_t param) const {
  const auto [segment, index] = segment_place(param);
  return segment >= 0 && stage3_.segments[size_t(segment)].persistent();
}

std::vector<PartitionFragment> ShardingPlan::fragments(int64_t g, int64_t rank) const {
  if (options_.stage == 3) return stage3_.fragments(g, rank);
  if (rank < 0 || rank >= options_.world)
    throw Error("sharding plan: rank " + std::to_string(rank) + " outside [0, " + std::to_string(options_.world) + ")");
  const auto& layout = groups_.at(size_t(g)).layout;
  const int64_t owned = owned_partition(int(rank));
  auto out = layout.fragments(owned);
  for (auto& f : out) f.flat_begin -= layout.partition_begin(owned);
  return out;
}

int64_t ShardingPlan::weight_buffer_elements(int64_t g) const {
  return options_.stage == 3 ? stage3_.weight_buffer_elements(g) : groups_.at(size_t(g)).layout.padded_numel;
}

std::vector<affine::TensorMap> ShardingPlan::weight_maps(int64_t g, affine::DType dtype) const {
  const auto& group = groups_.at(size_t(g));
  std::map<int, int64_t> buffers;
  for (int r = 0; r < options_.world; ++r) buffers[r] = weight_buffer_elements(g);
  std::vector<std::vector<affine::StoredRun>> runs(group.params.size());
  if (options_.stage == 3) {
    for (int r = 0; r < options_.world; ++r)
      for (const auto& f : fragments(g, r))
        if (!persistent(group.params[size_t(f.param_index)]))
          runs[size_t(f.param_index)].push_back({r, f.param_begin, f.param_begin + f.length, f.flat_begin});
    const int64_t p = stage3_.persistent_segment[size_t(g)];
    if (p >= 0) {
      const auto& segment = stage3_.segments[size_t(p)];
      for (size_t k = 0; k < segment.params.size(); ++k) {
        const auto& slot = segment.layout.params[k];
        const int64_t i = stage3_.index_in_group[size_t(segment.params[k])];
        for (int r = 0; r < options_.world; ++r)
          runs[size_t(i)].push_back({r, 0, slot.numel, segment.gathered_offset + slot.offset});
      }
    }
  } else {
    for (size_t i = 0; i < group.params.size(); ++i) {
      const auto& slot = group.layout.params[i];
      for (int r = 0; r < options_.world; ++r) runs[i].push_back({r, 0, slot.numel, slot.offset});
    }
  }
  std::vector<affine::TensorMap> out;
  for (size_t i = 0; i < group.params.size(); ++i)
    out.push_back(affine::stored_runs(info_of(parameters_[size_t(group.params[i])], dtype), runs[i], buffers));
  return out;
}

std::vector<affine::TensorMap> ShardingPlan::partition_maps(int64_t g, affine::DType dtype) const {
  const auto& group = groups_.at(size_t(g));
  std::map<int, int64_t> buffers;
  std::vector<std::vector<affine::StoredRun>> runs(group.params.size());
  for (int r = 0; r < options_.world; ++r) {
    buffers[r] = group.layout.partition_numel;
    for (const auto& f : fragments(g, r))
      runs[size_t(f.param_index)].push_back({r, f.param_begin, f.param_begin + f.length, f.flat_begin});
  }
  std::vector<affine::TensorMap> out;
  for (size_t i = 0; i < group.params.size(); ++i)
    out.push_back(affine::stored_runs(info_of(parameters_[size_t(group.params[i])], dtype), runs[i], buffers));
  return out;
}

}  // namespace tessera::zero
