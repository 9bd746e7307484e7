// plan() turns a target map and a source map of the same tensor into a Plan: it intersects every
// target piece with the source regions (distinct source boxes; replicas collapsed), lets the replica
// policy pick a holder for each intersection, emits one strided copy per intersection, collapses axes
// contiguous on both sides and merges segments whose addresses continue on both sides.
//
// Refusals (all before any data moves, identical on every process; errors.h): different logical
// shapes or dtypes; a target that does not cover the tensor; a source that does not cover it, or
// whose replicas disagree about their holders, or that names a holder not holding the whole box; two
// pieces of one rank on the same address or the same element; boxes outside the tensor or outside a
// buffer; strides that are not an axis-aligned layout (UnsupportedLayoutError). Source replicas cut
// at different boundaries (one holder stores a box whole, another in parts) are accepted: the source
// is cut to common boxes first (cut_replicas_to_common_boxes), and holders must agree cell by cell.
// Budgets are safety limits only, with a clear BudgetExceededError.
//
// Cost: O(n log n) in pieces, never per element: a (10^9, 8) tensor plans like a (10, 8) one.
// Argument order: target first, source second (as DeepSpeed's plan_transfer).
//
// Example: target = (8,8) columns on 4 ranks, source = rows on 2 ranks: 8 segments of shape (4,2),
// statistics.bytes_per_source_rank = {0: 128, 1: 128} for f32.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/affine/plan.h"
#include "core/affine/replica_policy.h"

namespace tessera::affine {

struct PlanOptions {
  ReplicaPolicy policy;
  int64_t max_pieces = int64_t{1} << 24;       // per map
  int64_t max_candidates = int64_t{1} << 26;   // intersections per batch
  int64_t max_segments = int64_t{1} << 26;     // per plan
  int64_t max_overlap_runs = int64_t{1} << 24;  // runs walked to check interleaved pieces
};

struct PlanRequest {
  const TensorMap* target_map = nullptr;
  const TensorMap* source_map = nullptr;
};

Plan plan(const TensorMap& target_map, const TensorMap& source_map, const PlanOptions& options = {});

// Plans many tensors at once. The replica policy sees all of them (balanced spreads the bytes of the
// whole batch; local and callback are applied in one canonical order). Plans come back in request
// order. Any refusal of any tensor throws before a plan is returned.
std::vector<Plan> plan_batch(const std::vector<PlanRequest>& requests, const PlanOptions& options = {});

// FNV-1a 64 over the canonical form of both maps (pieces sorted), and the policy's name and tables.
uint64_t input_digest(const TensorMap& target_map, const TensorMap& source_map, const ReplicaPolicy& policy);

}  // namespace tessera::affine
