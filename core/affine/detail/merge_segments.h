// Segment canonicalisation and merging, the last planner step.
//
// collapse(): drops axes of extent 1 and merges neighbouring axes that are contiguous on both sides
// (source and target), so a dense-to-dense copy becomes one 1-D segment with strides (1) and (1).
// merge_segments(): joins two segments of the same (source rank, target rank, strides) along an axis
// k when their other extents are equal and, on both sides, the second starts where the first ends
// (offset + shape[k] * stride[k]); iterated to a fixpoint with hash lookups, O(n) per pass.
// This is pure address continuity: segments from logically distant pieces merge when their storage
// continues (bigcode's q-rows and replicated KV rows fold into one copy).
#pragma once

#include <vector>

#include "core/affine/plan.h"

namespace tessera::affine::detail {

void collapse(Segment& segment);
void merge_segments(std::vector<Segment>& segments);
// Sorts by (target rank, target offset, source rank, source offset, shape).
void sort_segments(std::vector<Segment>& segments);

}  // namespace tessera::affine::detail
