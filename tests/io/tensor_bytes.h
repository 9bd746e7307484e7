// Byte-wise tensor comparison for the io tests: equal dtype, shape and every byte (NaN payloads
// and -0.0 included), which torch::equal alone does not promise for floating point.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>

namespace tessera::io::test {

// The tensor's bytes in row-major order, as a 1-D uint8 tensor (NaN payloads and -0.0 included).
inline at::Tensor bytes_of(const at::Tensor& tensor) {
  return tensor.contiguous().reshape({-1}).view(at::kByte);
}

inline bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(bytes_of(a), bytes_of(b));
}

}  // namespace tessera::io::test
