// The ZeRO-3 layout (Stage3Layout): units, their segments, and each rank's flat-group partition.
//
// A unit is a module that directly owns parameters (its dotted name, "" for the root); it is gathered
// before its forward and released after (reference/zero3_hooks.md, Scheme B': one flat buffer per
// unit, released at storage level). Units come in the first-appearance order of their parameters
// in named_parameters order. A unit's parameters split by flat group (parameter group x
// lower_precision, the keying of stages 1/2) into segments. Each segment is a FlatGroupLayout over
// the W data-parallel ranks, padded to a multiple of W * alignment: after an all-gather of its W
// pieces, every parameter of the segment is a contiguous run of the gathered buffer. A unit's
// gathered buffer holds its segments one after the other (one allocation per unit).
//
// Persistent parameters (numel <= persistence threshold, e.g. biases and norms, or forced by the
// plan's caller; the engine refuses tied weights at stage 3 instead) are never released: per flat group they form one persistent segment, laid out like a unit
// segment, whose gathered copy stays on every rank. As DeepSpeed does (ds_persist parameters keep
// their ds_tensor partition; fp32 partitions and optimizer states are cut like every other
// parameter's), they are still partitioned for the optimizer: their gradients reduce-scatter into
// the owners' pieces, the owner steps its piece, and the updated pieces are all-gathered back into
// the persistent copy. So the optimizer sees exactly one partition per flat group per rank.
//
// Flat group g's partition on rank r (P_g elements, the same on every rank) is the concatenation,
// in order, of rank r's piece of the group's persistent segment, then of each unit's segment of g
// in unit order; every piece is its segment's partition_numel long (padding at the piece's end).
// Weights of g on rank r live in one buffer of P_g + (persistent padded) elements: the partition,
// then the gathered persistent segment (the optimizer's pieces of the persistent parameters in the
// partition duplicate part of that copy, as DeepSpeed's ds_tensor does).
//
// Example: W = 2, alignment 2, threshold 4; l1.weight (3,5) and l2.weight (2,3) in group 0,
// l1.bias (5) and norm.weight (4) in group 1. Units l1, l2 (norm is persistent, so no unit).
// Group 0: segment (l1) 15 elements padded to 16, pieces of 8; segment (l2) 6 padded to 8, pieces of
// 4; P_0 = 12, rank 1 holds l1.weight[8, 15) at 0 and l2.weight[4, 6) at 8. Group 1: persistent
// segment (norm) 4, pieces of 2, at 0; segment (l1) 5 padded to 8, pieces of 4, at 2; P_1 = 6, its
// weight buffer 6 + 4 = 10 elements with norm.weight whole at 6. Unit l1's gathered buffer: 16 + 8.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/zero/flat_group_layout.h"

namespace tessera::zero {

// One ZeRO-3 unit: the module's non-persistent parameters, gathered and released together. Empty at
// stages 0-2.
struct UnitPlan {
  std::string module;
  std::vector<int64_t> params;    // model-wide indices, ascending (the module's persistent ones are not here)
  std::vector<int64_t> segments;  // indices into Stage3Layout::segments, ascending (= flat-group order)
  int64_t gathered_numel = 0;     // the unit's gathered buffer: every segment's padded_numel
};

// The parameters of one unit (or the persistent ones) inside one flat group.
struct Stage3Segment {
  int64_t unit = -1;             // index into units; -1: the group's persistent segment
  int64_t group = 0;             // flat group
  std::vector<int64_t> params;   // model-wide indices, ascending; layout.params[i] is params[i]
  FlatGroupLayout layout;        // the gathered segment (padded_numel) cut into W pieces (partition_numel)
  int64_t partition_offset = 0;  // each rank's piece: [partition_offset, + partition_numel) of its group partition
  // Where the gathered segment lives: a unit segment in its unit's gathered buffer; the persistent
  // segment in the group's weight buffer (right after the partition, so this is P_g).
  int64_t gathered_offset = 0;
  bool persistent() const { return unit < 0; }
};

// What the layout needs of each parameter (in named_parameters order).
struct Stage3Parameter {
  std::string name;
  std::string module;
  int64_t numel = 0;
  int64_t group = 0;        // flat group
  bool persistent = false;  // already decided (threshold or forced)
};

struct Stage3Layout {
  int64_t world = 1;
  std::vector<UnitPlan> units;
  std::vector<Stage3Segment> segments;  // group by group; in each, the persistent segment first, then units in order
  std::vector<std::vector<int64_t>> group_segments;  // per flat group: its segments in partition order
  std::vector<int64_t> partition_numel;              // per flat group: P_g
  std::vector<int64_t> persistent_segment;           // per flat group: its persistent segment, or -1
  std::vector<std::pair<int64_t, int64_t>> places;   // per parameter: (segment, index in the segment)
  std::vector<int64_t> index_in_group;               // per parameter: its index among its group's parameters

  // Rank `rank`'s fragments of flat group g, in partition order, padding excluded: param_index is the
  // parameter's index in the group, flat_begin its offset in the rank's group partition.
  std::vector<PartitionFragment> fragments(int64_t group, int64_t rank) const;
  // Elements of flat group g's weight buffer on every rank: P_g + the persistent segment's padded_numel.
  int64_t weight_buffer_elements(int64_t group) const;
};

// Throws tessera::Error for world < 1, alignment < 1, a negative numel, or a flat group outside
// [0, groups).
Stage3Layout make_stage3_layout(const std::vector<Stage3Parameter>& parameters, int64_t groups, int world,
                                int64_t alignment);

}  // namespace tessera::zero
