// Chunks and rounds: how a batch of plans is cut so that no more than a byte budget is in flight (or
// staged) at once. Shared by the local executor and the remote (UCX) executor of the transport layer.
//
// A Chunk is a sub-block of one segment (origin and shape inside the segment's index space), sized by
// its true byte count (product of all extents x element size) <= budget: a segment is cut along its
// outermost axis first (whole rows of a row-major block stay together), and only a single outer slice
// larger than the budget is cut along the next axis. Rounds pack chunks in plan order, next-fit, up
// to the budget each. Deterministic: every process computes the same chunks and rounds.
//
// Example: a 1-D f32 segment of 50,000,000 elements (200,000,000 bytes) with a 64 MiB budget becomes
// 3 chunks of 16,777,216 + 16,777,216 + 16,445,568 elements in 3 rounds (not 50 million one-element
// chunks); a (1,000,000 x 8) f32 row block with an 8 MiB budget becomes 4 chunks of at most 262,144
// whole rows (8 MiB each), not one 32 MB chunk over the budget.
#pragma once

#include <cstdint>
#include <vector>

#include "core/affine/plan.h"

namespace tessera::affine {

struct Chunk {
  size_t plan = 0;     // index in the batch
  size_t segment = 0;  // index in the plan
  Dims origin;         // inside the segment's index space
  Dims shape;
  int64_t bytes = 0;
};

// Cuts one segment; budget_bytes must be >= the element size (else BudgetExceededError).
std::vector<Chunk> chunk_segment(const Segment& segment, int64_t element_bytes, int64_t budget_bytes);

// All chunks of a batch packed into rounds of at most budget_bytes each.
std::vector<std::vector<Chunk>> schedule_rounds(const std::vector<const Plan*>& plans, int64_t budget_bytes);

}  // namespace tessera::affine
