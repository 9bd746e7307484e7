// strided_copy copies an N-D block between two strided byte layouts, collapsing axes that are
// contiguous on both sides first, so a dense block is one memcpy and a row block is one memcpy per
// row. Strides are in bytes; `element_bytes` is the element size. No overlap between source and
// destination is allowed (the executor refuses aliasing before calling this).
//
// Example: shape (4, 2) f32 from source strides (32, 4) to destination strides (8, 4): the inner axis
// is contiguous on both sides -> 4 memcpy calls of 8 bytes; with destination strides (8, 4) and
// source (8, 4) both axes collapse -> one memcpy of 32 bytes.
#pragma once

#include <cstdint>

#include "core/affine/box.h"

namespace tessera::affine::detail {

// Returns the number of memcpy-able runs it copied (for statistics).
int64_t strided_copy(uint8_t* dst, const Dims& dst_stride_bytes, const uint8_t* src, const Dims& src_stride_bytes,
                     const Dims& shape, int64_t element_bytes);

}  // namespace tessera::affine::detail
