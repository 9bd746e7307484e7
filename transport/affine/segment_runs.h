// How the remote executor walks a planned segment (core/affine/plan.h): its runs, whether its
// target is one dense block, and the element gather that packs a run. Header-only: the executor's
// inner loops inline them.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/affine/plan.h"
#include "transport/affine/streaming_copy.h"

namespace tessera::transport {

// Calls f(source_address, target_address, elements, source_step) for every run of a segment: a
// run is a whole innermost row when that axis is contiguous at the target (source_step is the
// source stride along it: 1 = contiguous at both ends), a single element otherwise.
template <class F>
inline void for_each_run(const affine::Segment& s, F&& f) {
  const int nd = s.shape.size();
  if (s.elements() == 0) return;
  if (nd == 0) return f(s.source_offset, s.target_offset, int64_t{1}, int64_t{1});
  const int inner = nd - 1;
  const bool rows = s.target_strides[inner] == 1;
  const int outer_axes = rows ? inner : nd;
  const int64_t run = rows ? s.shape[inner] : 1;
  const int64_t step = rows ? s.source_strides[inner] : 1;
  std::vector<int64_t> index(outer_axes, 0);
  for (;;) {
    int64_t src = s.source_offset, dst = s.target_offset;
    for (int k = 0; k < outer_axes; ++k) {
      src += index[k] * s.source_strides[k];
      dst += index[k] * s.target_strides[k];
    }
    f(src, dst, run, step);
    int k = outer_axes - 1;
    while (k >= 0 && ++index[k] == s.shape[k]) index[k--] = 0;
    if (k < 0) return;
  }
}

// Whether the segment's target is one dense row-major block (its runs land back to back), so its
// rows can be packed at the source and sent as one put per staging chunk.
inline bool dense_target(const affine::Segment& s) {
  int64_t expected = 1;
  for (int k = s.shape.size() - 1; k >= 0; --k) {
    if (s.shape[k] != 1 && s.target_strides[k] != expected) return false;
    expected *= s.shape[k];
  }
  return true;
}

// Copies n elements of es bytes, `step` elements apart at the source, to consecutive ones; a
// contiguous run with streaming stores when `streaming` (streaming_copy.h).
inline void gather_elements(char* dst, const char* src, int64_t n, int64_t step, int64_t es, bool streaming = false) {
  if (step == 1 && streaming) return streaming_copy(dst, src, static_cast<size_t>(n * es));
  if (step == 1) return void(std::memcpy(dst, src, static_cast<size_t>(n * es)));
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, src + i * step * es, static_cast<size_t>(es));
}

}  // namespace tessera::transport
