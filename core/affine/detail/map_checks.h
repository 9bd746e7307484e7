// The checks every map passes before planning, shared by validate_map() and plan().
//
// check_map() validates one map on its own (O(n log n) in pieces, never per element):
//   shape has <= 8 axes and no negative extent; each piece has the tensor's number of axes, a box
//   inside the tensor, non-negative nesting strides, an address range inside its rank's buffer, and
//   holders that are sorted, unique and include its own rank; no two pieces of one rank share an
//   address or a logical element; each rank named as a holder of a box holds all of it; the ranks
//   that hold exactly a box agree about its holders.
// check_source_regions() then requires distinct source boxes (regions) to be disjoint and to cover
// the tensor; check_target_coverage() requires the union of target boxes to be the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/affine/detail/box_index.h"

namespace tessera::affine::detail {

struct Frame {
  int rank;
  const Piece* piece;
};

struct CheckedMap {
  const TensorMap* map = nullptr;
  std::string role;            // "source", "target" or "map", for messages
  std::vector<Frame> frames;   // nonempty pieces sorted by (box, rank)
  std::vector<size_t> group_begin;  // frames[group_begin[g] .. group_begin[g+1]) share one box
  int64_t pieces = 0;          // including empty ones

  size_t groups() const { return group_begin.empty() ? 0 : group_begin.size() - 1; }
  const Box& group_box(size_t g) const { return frames[group_begin[g]].piece->box; }
};

struct CheckLimits {
  int64_t max_pieces = int64_t{1} << 24;
  int64_t max_overlap_runs = int64_t{1} << 24;
};

// `allow_recut_replicas`: a declared holder that holds the box cut into other pieces is accepted
// (targets); otherwise it is an UnsupportedLayoutError (sources).
CheckedMap check_map(const TensorMap& map, const std::string& role, bool allow_recut_replicas,
                     const CheckLimits& limits);

// check_map for a source: replicas cut at different boundaries (one holder stores a box whole,
// another in parts) are accepted by checking, instead, a copy cut to common boxes, which `refined`
// then owns (frames point into it). Holders must still agree cell by cell.
CheckedMap check_source_map(const TensorMap& map, const std::string& role, const CheckLimits& limits,
                            std::unique_ptr<TensorMap>& refined);

// Distinct boxes must be disjoint and cover the tensor exactly. Returns the region index.
BoxIndex check_source_regions(const CheckedMap& checked);

// The union of the boxes must equal the tensor (boxes may overlap: replicas cut differently).
void check_target_coverage(const CheckedMap& checked);

// "source rank 3" etc.
std::string rank_label(const CheckedMap& checked, int rank);
std::string holders_label(const std::vector<int>& holders);  // "{0,1,2}"

}  // namespace tessera::affine::detail
