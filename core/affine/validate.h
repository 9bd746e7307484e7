// validate_map() checks one map on its own, exactly as plan() checks a source map, and summarises it.
//
// A valid map: boxes inside the tensor, strides axis-aligned and nesting, addresses inside each
// rank's buffer, no two pieces of a rank on one address or one logical element, holders that hold
// what they are named for and agree, distinct boxes disjoint and covering the tensor. Throws the
// errors of errors.h, naming tensor, rank and box. O(n log n) in pieces.
//
// Example: the (8,8) row split over 2 ranks summarises as pieces_per_rank {0: 1, 1: 1},
// elements_per_rank {0: 32, 1: 32}, regions 2, covered_elements 64.
#pragma once

#include <cstdint>
#include <map>

#include "core/affine/affine_map.h"

namespace tessera::affine {

struct MapSummary {
  int64_t pieces = 0;            // including empty pieces
  int64_t nonempty_pieces = 0;
  int64_t regions = 0;           // distinct boxes (replicas collapsed)
  int64_t covered_elements = 0;  // logical elements covered (numel for a valid map)
  std::map<int, int64_t> pieces_per_rank;
  std::map<int, int64_t> elements_per_rank;  // stored logical elements per rank
};

struct ValidateOptions {
  bool require_coverage = true;  // false: a partial map (one side of a batch) is fine
  int64_t max_pieces = int64_t{1} << 24;
};

MapSummary validate_map(const TensorMap& map, const ValidateOptions& options = {});

}  // namespace tessera::affine
