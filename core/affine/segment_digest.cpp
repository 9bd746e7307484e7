#include "core/affine/segment_digest.h"

#include <xxhash.h>

#include <memory>

namespace tessera::affine {

std::map<std::pair<int, int>, uint64_t> segment_digests(const Plan& plan, const std::map<int, LocalBuffer>& buffers,
                                                        bool source_side) {
  struct StateFree {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::map<std::pair<int, int>, std::unique_ptr<XXH3_state_t, StateFree>> states;
  const int64_t es = element_size(plan.dtype);
  for (const auto& s : plan.segments) {
    const int rank = source_side ? s.source_rank : s.target_rank;
    auto buffer = buffers.find(rank);
    if (buffer == buffers.end()) continue;
    auto& state = states[{s.source_rank, s.target_rank}];
    if (!state) {
      state.reset(XXH3_createState());
      XXH3_64bits_reset(state.get());
    }
    const auto* base = static_cast<const uint8_t*>(buffer->second.data);
    const int64_t offset = source_side ? s.source_offset : s.target_offset;
    const Dims& strides = source_side ? s.source_strides : s.target_strides;
    const int nd = s.shape.size();
    if (s.elements() == 0) continue;
    if (nd == 0) {
      XXH3_64bits_update(state.get(), base + offset * es, size_t(es));
      continue;
    }
    // Rows of the innermost axis: one update per contiguous row, else one per element.
    Dims index(nd, 0);
    const int64_t inner = s.shape[nd - 1], inner_stride = strides[nd - 1];
    for (;;) {
      int64_t at = offset;
      for (int k = 0; k < nd - 1; ++k) at += index[k] * strides[k];
      if (inner_stride == 1) {
        XXH3_64bits_update(state.get(), base + at * es, size_t(inner * es));
      } else {
        for (int64_t i = 0; i < inner; ++i) XXH3_64bits_update(state.get(), base + (at + i * inner_stride) * es, size_t(es));
      }
      int k = nd - 2;
      while (k >= 0 && ++index[k] == s.shape[k]) index[k] = 0, --k;
      if (k < 0) break;
    }
  }
  std::map<std::pair<int, int>, uint64_t> out;
  for (const auto& [pair, state] : states) out[pair] = XXH3_64bits_digest(state.get());
  return out;
}

}  // namespace tessera::affine
