// A Plan is the list of strided copies that moves one tensor from the storage a source map describes
// into the storage a target map describes: each Segment copies `shape` elements from
//   source buffer of source_rank, at source_offset + sum_k i[k] * source_strides[k]
// to
//   target buffer of target_rank, at target_offset + sum_k i[k] * target_strides[k],
// for every index i in [0, shape). Offsets and strides count elements of `dtype`.
//
// Invariants (established by plan(), re-checked by the executors): every element of every target
// piece is written by exactly one segment; segments are sorted by (target rank, target offset,
// source rank, source offset); axes contiguous on both sides are collapsed, so a dense-to-dense copy
// is a 1-D segment with strides (1) and (1); plans are deterministic functions of their inputs, and
// `input_digest` (FNV-1a 64 of the canonical maps, dtype and policy) lets processes check that they
// planned the same thing; digest() hashes the segments themselves.
//
// Example: (8,8) f32 rows on 2 ranks -> columns on 4 ranks: 8 segments of shape (4,2), e.g.
//   source rank 1 offset 2 strides (8,1) -> target rank 1 offset 8 strides (2,1)
// moves rows 4..7 of columns 2..3 (8 elements, 32 bytes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/affine/box.h"
#include "core/affine/dtype.h"

namespace tessera::affine {

struct Segment {
  int source_rank = 0;
  int64_t source_offset = 0;
  Dims source_strides;
  int target_rank = 0;
  int64_t target_offset = 0;
  Dims target_strides;
  Dims shape;

  int64_t elements() const { return shape.product(); }
  friend bool operator==(const Segment& a, const Segment& b);
  friend bool operator!=(const Segment& a, const Segment& b) { return !(a == b); }
};

struct PlanStatistics {
  int64_t source_pieces = 0;       // nonempty source pieces (replicas counted separately)
  int64_t source_regions = 0;      // distinct source boxes (replicas collapsed)
  int64_t target_pieces = 0;       // nonempty target pieces
  int64_t candidate_segments = 0;  // intersections before merging (after balanced splits)
  int64_t segments = 0;            // after merging
  int64_t moved_elements = 0;      // sum of segment elements (> numel when targets are replicated)
  int64_t moved_bytes = 0;
  std::map<int, int64_t> bytes_per_source_rank;
  std::map<std::pair<int, int>, int64_t> bytes_per_pair;  // (source rank, target rank) -> bytes
  friend bool operator==(const PlanStatistics& a, const PlanStatistics& b);
};

struct Plan {
  std::string name;  // the tensor's name
  DType dtype = DType::f32;
  Dims shape;          // logical shape of the tensor
  std::string policy;  // replica policy that chose the sources ("lowest", "balanced", ...)
  uint64_t input_digest = 0;
  std::vector<Segment> segments;
  PlanStatistics statistics;

  uint64_t digest() const;  // FNV-1a 64 over name, dtype, shape and every segment
  friend bool operator==(const Plan& a, const Plan& b);
  friend bool operator!=(const Plan& a, const Plan& b) { return !(a == b); }
};

// Recomputes the statistics that depend only on the segments (segments, moved_*, bytes_*).
void recompute_segment_statistics(Plan& plan);

}  // namespace tessera::affine
