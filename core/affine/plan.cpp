#include "core/affine/plan.h"

#include "core/affine/detail/digest.h"

namespace tessera::affine {

bool operator==(const Segment& a, const Segment& b) {
  return a.source_rank == b.source_rank && a.source_offset == b.source_offset &&
         a.source_strides == b.source_strides && a.target_rank == b.target_rank &&
         a.target_offset == b.target_offset && a.target_strides == b.target_strides && a.shape == b.shape;
}

bool operator==(const PlanStatistics& a, const PlanStatistics& b) {
  return a.source_pieces == b.source_pieces && a.source_regions == b.source_regions &&
         a.target_pieces == b.target_pieces && a.candidate_segments == b.candidate_segments &&
         a.segments == b.segments && a.moved_elements == b.moved_elements && a.moved_bytes == b.moved_bytes &&
         a.bytes_per_source_rank == b.bytes_per_source_rank && a.bytes_per_pair == b.bytes_per_pair;
}

uint64_t Plan::digest() const {
  detail::Fnv64 h;
  h.add(std::string("tessera.plan.v1"));
  h.add(name);
  h.add(std::string(dtype_name(dtype)));
  h.add(shape);
  h.add(static_cast<uint64_t>(segments.size()));
  for (const auto& s : segments) {
    h.add_signed(s.source_rank);
    h.add_signed(s.source_offset);
    h.add(s.source_strides);
    h.add_signed(s.target_rank);
    h.add_signed(s.target_offset);
    h.add(s.target_strides);
    h.add(s.shape);
  }
  return h.value();
}

bool operator==(const Plan& a, const Plan& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.policy == b.policy &&
         a.input_digest == b.input_digest && a.segments == b.segments && a.statistics == b.statistics;
}

void recompute_segment_statistics(Plan& plan) {
  auto& st = plan.statistics;
  st.segments = static_cast<int64_t>(plan.segments.size());
  st.moved_elements = 0;
  st.bytes_per_source_rank.clear();
  st.bytes_per_pair.clear();
  const int64_t esize = element_size(plan.dtype);
  for (const auto& s : plan.segments) {
    const int64_t n = s.elements();
    st.moved_elements += n;
    st.bytes_per_source_rank[s.source_rank] += n * esize;
    st.bytes_per_pair[{s.source_rank, s.target_rank}] += n * esize;
  }
  st.moved_bytes = st.moved_elements * esize;
}

}  // namespace tessera::affine
