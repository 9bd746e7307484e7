// A ShardingPlan is every layout of one training engine, computed once at initialize from the
// named parameters, their groups, the stage, the data-parallel size and the bucket and sub-group
// sizes: the flat groups and their partitions, the optimizer's sub-groups, the bucket plan and the
// affine maps of every stored kind. It is the only source of offsets (DESIGN.md §2, layout rule):
// actors, storage maps, checkpoints and weight sync read them here and never re-derive one.
//
// Flat groups (ZeRO-1/2 "bit16 groups"): one per (parameter group, gradient comm dtype) in that
// order (with torch_autocast a parameter group splits into its lower-precision-safe parameters and
// the rest); each a FlatGroupLayout over `partitions()` ranks: the data-parallel size at stages
// >= 1 (partitions aligned to 2 elements, as DeepSpeed's), one partition holding everything at
// stage 0. Rank r updates partition owned_partition(r). Sub-groups cut every partition alike into
// runs of at most sub_group_elements (zero_optimization.sub_group_size): the optimizer steps one
// sub-group at a time, and offload will swap them. ZeRO-3 units have their place (`units`), filled
// by the ZeRO-3 issue; at stages 0-2 there are none.
//
// Example: parameters a (3, 5) and b (7,) in one group, stage 2, 2 ranks, sub_group_elements 5:
// 22 elements padded to 24, partitions of 12 (rank 1 holds a[12, 15) at 0 and b at 3), sub-groups
// [0, 5), [5, 10), [10, 12); buckets of 8 elements: [14, 22) and [12, 14) owned by rank 1, [4, 12)
// and [0, 4) by rank 0. partition_maps(0, f32)[0] (a) gives rank 0 Box((0,0)+(2,5)) at 0 and
// Box((2,0)+(1,2)) at 10, rank 1 Box((2,2)+(1,3)) at 0.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/zero/bucket_plan.h"
#include "core/zero/flat_group_layout.h"

namespace tessera::zero {

struct PlannedParameter {
  std::string name;            // dotted, from named_parameters()
  std::vector<int64_t> shape;
  int64_t param_group = 0;     // the user's parameter group
  bool lower_precision = false;  // torch_autocast: gradients reduced in the autocast dtype
  int64_t numel() const;
};

struct ShardingPlanOptions {
  int64_t stage = 0;
  int world = 1;                              // data-parallel size
  int64_t bucket_elements = 500'000'000;      // zero_optimization.reduce_bucket_size
  int64_t sub_group_elements = 1'000'000'000;  // zero_optimization.sub_group_size
};

// A run [begin, end) of every partition of a flat group (partition-relative, end exclusive).
struct SubGroup {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t elements() const { return end - begin; }
};

struct FlatGroupPlan {
  int64_t param_group = 0;
  bool lower_precision = false;
  std::vector<int64_t> params;  // model-wide parameter indices, ascending
  FlatGroupLayout layout;
  std::vector<SubGroup> sub_groups;  // tile [0, layout.partition_numel)
};

// ZeRO-3 (issue 12): the parameters of one module, gathered before its forward and released
// after. Empty at stages 0-2.
struct UnitPlan {
  std::string module;
  std::vector<int64_t> params;
};

class ShardingPlan {
 public:
  // Throws tessera::Error for an empty parameter list, a stage outside 0..2 (3 waits for its
  // issue), world < 1, bucket or sub-group sizes < 1, or parameter groups that are not numbered
  // 0..n-1 with every group used.
  ShardingPlan(std::vector<PlannedParameter> parameters, const ShardingPlanOptions& options);

  const ShardingPlanOptions& options() const { return options_; }
  int64_t stage() const { return options_.stage; }
  int world() const { return options_.world; }
  const std::vector<PlannedParameter>& parameters() const { return parameters_; }
  const std::vector<FlatGroupPlan>& groups() const { return groups_; }
  const BucketPlan& buckets() const { return buckets_; }
  const std::vector<UnitPlan>& units() const { return units_; }
  // Parameter `param`'s (flat group, index in the group).
  std::pair<int64_t, int64_t> place(int64_t param) const { return places_.at(size_t(param)); }

  int partitions() const { return options_.stage >= 1 ? options_.world : 1; }  // per flat group
  int64_t alignment() const { return options_.stage >= 1 ? 2 : 1; }
  int64_t owned_partition(int rank) const { return options_.stage >= 1 ? rank : 0; }
  // ZeRO-2 across ranks: no flat gradient buffer; buckets are reduced to their owners.
  bool partitioned_gradients() const { return options_.stage == 2 && options_.world > 1; }
  // The largest sub-group of any flat group (what one optimizer scratch buffer must hold).
  int64_t largest_sub_group() const;

  // Affine maps over the data-parallel ranks, one per parameter of flat group g, in its order,
  // with element type `dtype`. Weights: every rank holds every parameter in the group's flat
  // buffer (padded_numel elements) at its slot's offset. Partitioned kinds (fp32 master,
  // optimizer states): rank r's buffer is its partition (partition_numel elements) and holds the
  // fragments layout.fragments(owned_partition(r)); at stage 0 every rank holds the whole group.
  std::vector<affine::TensorMap> weight_maps(int64_t group, affine::DType dtype) const;
  std::vector<affine::TensorMap> partition_maps(int64_t group, affine::DType dtype) const;

 private:
  ShardingPlanOptions options_;
  std::vector<PlannedParameter> parameters_;
  std::vector<FlatGroupPlan> groups_;
  BucketPlan buckets_;
  std::vector<UnitPlan> units_;
  std::vector<std::pair<int64_t, int64_t>> places_;
};

}  // namespace tessera::zero
