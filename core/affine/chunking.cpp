#include "core/affine/chunking.h"

#include <algorithm>

#include "core/affine/errors.h"

namespace tessera::affine {
namespace {

void cut(const Segment& s, int axis, Dims origin, int64_t element_bytes, int64_t budget, std::vector<Chunk>& out) {
  const int ndim = s.shape.size();
  // Bytes of one index of `axis` (the block of all inner axes).
  int64_t slice_bytes = element_bytes;
  for (int k = axis + 1; k < ndim; ++k) slice_bytes *= s.shape[k];
  const int64_t extent = s.shape[axis];
  if (slice_bytes > budget && axis + 1 < ndim) {
    for (int64_t i = 0; i < extent; ++i) {
      Dims o = origin;
      o[axis] = i;
      cut(s, axis + 1, o, element_bytes, budget, out);
    }
    return;
  }
  const int64_t per_chunk = std::max<int64_t>(1, std::min(extent, budget / slice_bytes));
  for (int64_t at = 0; at < extent; at += per_chunk) {
    Chunk c;
    c.origin = origin;
    c.origin[axis] = at;
    c.shape = s.shape;
    for (int k = 0; k < axis; ++k) c.shape[k] = 1;
    c.shape[axis] = std::min(per_chunk, extent - at);
    c.bytes = c.shape.product() * element_bytes;
    out.push_back(c);
  }
}

}  // namespace

std::vector<Chunk> chunk_segment(const Segment& segment, int64_t element_bytes, int64_t budget_bytes) {
  if (budget_bytes < element_bytes || element_bytes <= 0) {
    throw BudgetExceededError("a staging budget of " + std::to_string(budget_bytes) +
                              " bytes cannot hold one element of " + std::to_string(element_bytes) + " bytes");
  }
  std::vector<Chunk> out;
  if (segment.shape.size() == 0 || segment.elements() == 0) return out;
  cut(segment, 0, Dims(segment.shape.size()), element_bytes, budget_bytes, out);
  return out;
}

std::vector<std::vector<Chunk>> schedule_rounds(const std::vector<const Plan*>& plans, int64_t budget_bytes) {
  std::vector<std::vector<Chunk>> rounds;
  int64_t in_round = 0;
  for (size_t p = 0; p < plans.size(); ++p) {
    const int64_t esize = element_size(plans[p]->dtype);
    for (size_t s = 0; s < plans[p]->segments.size(); ++s) {
      for (Chunk& c : chunk_segment(plans[p]->segments[s], esize, budget_bytes)) {
        c.plan = p;
        c.segment = s;
        if (rounds.empty() || in_round + c.bytes > budget_bytes) {
          rounds.emplace_back();
          in_round = 0;
        }
        in_round += c.bytes;
        rounds.back().push_back(c);
      }
    }
  }
  return rounds;
}

}  // namespace tessera::affine
