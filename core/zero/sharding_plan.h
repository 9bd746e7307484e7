// A ShardingPlan is every layout of one training engine, computed once at initialize from the
// named parameters, their groups, the stage, the data-parallel size and the bucket and sub-group
// sizes: the flat groups and their partitions, the optimizer's sub-groups, the bucket plan, the
// ZeRO-3 units and the affine maps of every stored kind. It is the only source of offsets
// (docs/DESIGN.md §7.7, layout rule): actors, storage maps, checkpoints and weight sync read them here and
// never re-derive one.
//
// Flat groups (ZeRO-1/2 "bit16 groups"): one per (parameter group, gradient comm dtype) in that
// order (with torch_autocast a parameter group splits into its lower-precision-safe parameters and
// the rest); each a FlatGroupLayout over `partitions()` ranks: the data-parallel size at stages
// >= 1 (partitions aligned to 2 elements, as DeepSpeed's), one partition holding everything at
// stage 0. Rank r updates partition owned_partition(r). Sub-groups cut every partition alike into
// runs of at most sub_group_elements (zero_optimization.sub_group_size): the optimizer steps one
// sub-group at a time, and offload will swap them.
//
// Stage 3 (unit_layout.h): no buffer holds a flat group whole. Each module that directly owns
// parameters is a unit; its parameters of one flat group form a segment laid out over the W ranks,
// and rank r's partition of flat group g concatenates its pieces of g's segments (the persistent
// segment first, then the units in order). FlatGroupPlan::layout then carries only the sizes
// (dp_size W, numel, partition_numel P_g, padded_numel W * P_g) and no parameter slots, so its
// fragments() are empty and padding_in_partition() means nothing: read offsets from fragments(),
// segments() and units(). Buckets are empty at stage 3: the gradient reducer reduce-scatters each
// segment (its gathered-size gradient buffer into the W pieces; the persistent one too, once all
// its gradients are ready), which a BucketPlan of flat ranges of one group buffer cannot express.
// Sub-groups cut P_g as at stages 1/2.
//
// Example: parameters a (3, 5) and b (7,) in one group, stage 2, 2 ranks, sub_group_elements 5:
// 22 elements padded to 24, partitions of 12 (rank 1 holds a[12, 15) at 0 and b at 3), sub-groups
// [0, 5), [5, 10), [10, 12); buckets of 8 elements: [14, 22) and [12, 14) owned by rank 1, [4, 12)
// and [0, 4) by rank 0. partition_maps(0, f32)[0] (a) gives rank 0 Box((0,0)+(2,5)) at 0 and
// Box((2,0)+(1,2)) at 10, rank 1 Box((2,2)+(1,3)) at 0. At stage 3 with a in module "l1" and b in
// "l2": segments of 16 and 8 elements, P = 8 + 4; rank 1 holds a[8, 15) at 0 and b[4, 7) at 8.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/zero/bucket_plan.h"
#include "core/zero/flat_group_layout.h"
#include "core/zero/unit_layout.h"

namespace tessera::zero {

struct PlannedParameter {
  std::string name;            // dotted, from named_parameters()
  std::vector<int64_t> shape;
  int64_t param_group = 0;     // the user's parameter group
  bool lower_precision = false;  // torch_autocast: gradients reduced in the autocast dtype
  std::string module;          // stage 3: the dotted name of the module owning it directly ("" = root)
  bool persistent = false;     // stage 3: keep gathered whatever its size (e.g. a weight tied to two modules)
  int64_t numel() const;
};

// Stage 2 stages each bucket's gradients in a ring of two slots of the largest bucket
// (actors/bucket_staging.h), so its buckets are at most this many elements whatever
// reduce_bucket_size says: DeepSpeed's default 5e8 would make the ring as large as the gradients
// partitioning saves. 2 x 4 MiB in fp32; a bucket's reduction is elementwise, so the cut changes
// no result.
inline constexpr int64_t kMaxStagedBucketElements = int64_t(1) << 20;

// How a plan's gradients are reduced, decided once by the stage and the world size.
enum class GradientMode {
  all_reduce,           // stages 0/1 (and 2 on one rank): flat gradient buffers, buckets all-reduced in place
  reduce_to_owner,      // stage 2 across ranks: buckets staged, each reduced to its partition's owner
  unit_reduce_scatter,  // stage 3: each unit's segments staged and reduce-scattered into the partitions
};

struct ShardingPlanOptions {
  int64_t stage = 0;
  int world = 1;                              // data-parallel size
  // The engine passes the config's values (their defaults are written once there).
  // zero_optimization.reduce_bucket_size, stages 0-2 (stage 2: at most kMaxStagedBucketElements);
  // 0 = one bucket per parameter, DeepSpeed's meaning (BucketCut::per_parameter).
  int64_t bucket_elements = 0;
  int64_t sub_group_elements = 0;  // zero_optimization.sub_group_size; required (>= 1)
  // Stage 3: parameters of at most this many elements stay gathered (stage3_param_persistence_threshold).
  // 0 (only empty parameters) here, so a plan built by hand keeps every parameter partitioned; the
  // engine passes the config's value (DeepSpeed's default 100,000). Ignored at stages 0-2.
  int64_t persistence_threshold = 0;
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
  FlatGroupLayout layout;       // stage 3: sizes only, no slots (see above)
  std::vector<SubGroup> sub_groups;  // tile [0, layout.partition_numel)
  std::vector<int64_t> segments;     // stage 3: indices into segments(), in partition order
};

class ShardingPlan {
 public:
  // Throws tessera::Error for an empty parameter list, a stage outside 0..3, world < 1, bucket or
  // sub-group sizes < 1, a negative persistence threshold, or parameter groups that are not
  // numbered 0..n-1 with every group used.
  ShardingPlan(std::vector<PlannedParameter> parameters, const ShardingPlanOptions& options);

  const ShardingPlanOptions& options() const { return options_; }
  int64_t stage() const { return options_.stage; }
  int world() const { return options_.world; }
  const std::vector<PlannedParameter>& parameters() const { return parameters_; }
  const std::vector<FlatGroupPlan>& groups() const { return groups_; }
  const BucketPlan& buckets() const { return buckets_; }
  // Stage 3 (empty before): units in first-appearance order, and every segment (unit_layout.h).
  const std::vector<UnitPlan>& units() const { return stage3_.units; }
  const std::vector<Stage3Segment>& segments() const { return stage3_.segments; }
  // Parameter `param`'s (flat group, index in the group).
  std::pair<int64_t, int64_t> place(int64_t param) const { return places_.at(size_t(param)); }
  // Stage 3: parameter `param`'s (segment, index in the segment); (-1, -1) at stages 0-2.
  std::pair<int64_t, int64_t> segment_place(int64_t param) const;
  // Stage 3: whether `param` stays gathered (numel <= persistence threshold, or forced); false before.
  bool persistent(int64_t param) const;

  int partitions() const { return options_.stage >= 1 ? options_.world : 1; }  // per flat group
  int64_t alignment() const { return options_.stage >= 1 ? 2 : 1; }
  int64_t owned_partition(int rank) const { return options_.stage >= 1 ? rank : 0; }
  // ZeRO-2 across ranks: no flat gradient buffer; buckets are reduced to their owners. (Stage 3
  // partitions gradients too, but per segment and without buckets: false there.)
  bool partitioned_gradients() const { return gradient_mode() == GradientMode::reduce_to_owner; }
  GradientMode gradient_mode() const {
    if (options_.stage == 3) return GradientMode::unit_reduce_scatter;
    return options_.stage == 2 && options_.world > 1 ? GradientMode::reduce_to_owner : GradientMode::all_reduce;
  }
  // No flat gradient buffer: gradients are staged and each rank keeps its partition (stages 2-3 across ranks, 3 always).
  bool staged_gradients() const { return gradient_mode() != GradientMode::all_reduce; }
  // The largest sub-group of any flat group (what one optimizer scratch buffer must hold).
  int64_t largest_sub_group() const;

  // Rank `rank`'s fragments of flat group g's partition, every stage, padding excluded:
  // param_index is the index in the group, flat_begin the offset in the rank's partition
  // (layout.partition_numel elements; stages 0-2: layout.fragments(owned_partition(rank)) shifted).
  std::vector<PartitionFragment> fragments(int64_t group, int64_t rank) const;
  // Elements of flat group g's weight buffer on every rank: padded_numel at stages 0-2; at stage 3
  // the partition followed by the gathered persistent segment.
  int64_t weight_buffer_elements(int64_t group) const;

  // Affine maps over the data-parallel ranks, one per parameter of flat group g, in its order,
  // with element type `dtype`. Partitioned kinds (fp32 master, optimizer states): rank r's buffer
  // is its partition (partition_numel elements) holding fragments(g, r); at stage 0 every rank
  // holds the whole group. Weights (buffer weight_buffer_elements): stages 0-2, every rank holds
  // every parameter at its slot's offset; stage 3, a partitioned parameter as in partition_maps, a
  // persistent one whole on every rank at its place in the gathered persistent segment (not its
  // pieces in the partition: a map may hold an element once per rank).
  std::vector<affine::TensorMap> weight_maps(int64_t group, affine::DType dtype) const;
  std::vector<affine::TensorMap> partition_maps(int64_t group, affine::DType dtype) const;

 private:
  ShardingPlanOptions options_;
  std::vector<PlannedParameter> parameters_;
  std::vector<FlatGroupPlan> groups_;
  BucketPlan buckets_;
  Stage3Layout stage3_;  // stage 3 only
  std::vector<std::pair<int64_t, int64_t>> places_;
};

}  // namespace tessera::zero
