#include "core/affine/detail/strided_copy.h"

#include <cstring>

namespace tessera::affine::detail {
namespace {

template <class T>
void copy_elements(uint8_t* dst, int64_t dst_stride, const uint8_t* src, int64_t src_stride, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * src_stride, sizeof(T));
    std::memcpy(dst + i * dst_stride, &v, sizeof(T));
  }
}

}  // namespace

int64_t strided_copy(uint8_t* dst, const Dims& dst_stride_bytes, const uint8_t* src, const Dims& src_stride_bytes,
                     const Dims& shape, int64_t element_bytes) {
  // Collapse: drop extent-1 axes, merge neighbours contiguous on both sides.
  int64_t ext[kMaxDims], ds[kMaxDims], ss[kMaxDims];
  int n = 0;
  for (int k = 0; k < shape.size(); ++k) {
    if (shape[k] == 0) return 0;
    if (shape[k] == 1) continue;
    if (n > 0 && ds[n - 1] == dst_stride_bytes[k] * shape[k] && ss[n - 1] == src_stride_bytes[k] * shape[k]) {
      ext[n - 1] *= shape[k];
      ds[n - 1] = dst_stride_bytes[k];
      ss[n - 1] = src_stride_bytes[k];
      continue;
    }
    ext[n] = shape[k];
    ds[n] = dst_stride_bytes[k];
    ss[n] = src_stride_bytes[k];
    ++n;
  }
  // Innermost run: contiguous bytes on both sides, or one element.
  int64_t run_bytes = element_bytes;
  bool strided_inner = false;
  if (n > 0 && ds[n - 1] == element_bytes && ss[n - 1] == element_bytes) {
    run_bytes = ext[n - 1] * element_bytes;
    --n;
  } else if (n > 0) {
    strided_inner = true;  // innermost axis is strided on at least one side: element loop
  }
  const int outer = strided_inner ? n - 1 : n;
  int64_t index[kMaxDims] = {0};
  int64_t runs = 0;
  for (;;) {
    if (strided_inner) {
      const int64_t e = ext[n - 1], d = ds[n - 1], s = ss[n - 1];
      switch (element_bytes) {
        case 1: copy_elements<uint8_t>(dst, d, src, s, e); break;
        case 2: copy_elements<uint16_t>(dst, d, src, s, e); break;
        case 4: copy_elements<uint32_t>(dst, d, src, s, e); break;
        case 8: copy_elements<uint64_t>(dst, d, src, s, e); break;
        default:
          for (int64_t i = 0; i < e; ++i) std::memcpy(dst + i * d, src + i * s, static_cast<size_t>(element_bytes));
      }
      runs += e;
    } else {
      std::memcpy(dst, src, static_cast<size_t>(run_bytes));
      ++runs;
    }
    int k = outer - 1;
    for (; k >= 0; --k) {
      dst += ds[k];
      src += ss[k];
      if (++index[k] < ext[k]) break;
      dst -= ds[k] * ext[k];
      src -= ss[k] * ext[k];
      index[k] = 0;
    }
    if (k < 0) break;
  }
  return runs;
}

}  // namespace tessera::affine::detail
