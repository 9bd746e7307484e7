// Digests of the bytes a plan moves, so both ends of a transfer can prove that what arrived is
// what was sent: for each (source rank, target rank) pair, XXH3-64 over the bytes of that pair's
// segments in plan order, each segment in row-major index order. The source side reads its
// buffers, the target side its own after the transfer; equal digests, equal bytes. (Hashes of
// slices do not compose, so both sides must hash exactly these runs in this order.)
//
// Example: the (8,8) rows-on-2 -> columns-on-4 plan: source rank 0 computes digests for pairs
// (0,0)..(0,3) from its buffer; target rank 2 computes (0,2) and (1,2) from its own.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "core/affine/local_executor.h"
#include "core/affine/plan.h"

namespace tessera::affine {

// The pairs whose source (source_side) or target rank is in `buffers`, with their digests.
std::map<std::pair<int, int>, uint64_t> segment_digests(const Plan& plan, const std::map<int, LocalBuffer>& buffers,
                                                        bool source_side);

}  // namespace tessera::affine
