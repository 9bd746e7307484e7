// A StridedRegion is the set of addresses a strided box touches in a flat buffer:
//   { base + sum_k i[k] * strides[k] + j  :  0 <= i[k] < extents[k],  0 <= j < width }
// (addresses in any unit: elements with width 1 for map checks, bytes with width = element size for
// the executor). Strides must nest (validated before), so distinct indices have distinct addresses.
//
// find_overlap() reports two regions that share an address, exactly, in O(n log n) for regions whose
// address spans do not overlap (the common case: pieces that tile a buffer) and by walking the
// contiguous runs of the smaller region otherwise (interleaved column pieces), under a budget.
//
// Example: in a row-major (4, 6) buffer, columns 0..2 are {base 0, extents (4,3), strides (6,1)} and
// columns 3..5 are {base 3, ...}: their spans [0, 21) and [3, 24) overlap, their addresses do not.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/affine/box.h"

namespace tessera::affine::detail {

struct StridedRegion {
  int64_t base = 0;
  Dims extents;
  Dims strides;
  int64_t width = 1;  // contiguous units per index (element size in bytes, or 1)

  bool empty() const;
  int64_t first() const { return base; }
  int64_t last() const;  // one past the highest address touched (base when empty)
};

// Drops extent-1 axes, sorts by stride (outermost first), folds contiguous axes into `width` and
// merges axes that are contiguous with each other. Same address set.
StridedRegion canonical(const StridedRegion& region);

// True when the two regions share at least one address. `budget` bounds the runs walked; exceeding it
// throws BudgetExceededError.
bool regions_overlap(const StridedRegion& a, const StridedRegion& b, int64_t budget = int64_t{1} << 24);

// The first pair (i, j), i != j, of regions that share an address, or nullopt. Regions that are empty
// are ignored.
std::optional<std::pair<size_t, size_t>> find_overlap(const std::vector<StridedRegion>& regions,
                                                      int64_t budget = int64_t{1} << 24);

}  // namespace tessera::affine::detail
