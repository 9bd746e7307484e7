// run_boxes cuts a contiguous run [begin, end) of a tensor's row-major element order into dense N-D
// boxes of the tensor's own index space: the form in which a 1-D ZeRO fragment of an N-D tensor
// becomes a few pieces instead of one piece per row.
//
// Invariants: the boxes are disjoint, listed in row-major order, their volumes sum to end - begin,
// and there are at most 2*ndim - 1 of them (ndim >= 1): at most ndim - 1 boxes finish the partly
// filled trailing sub-blocks at `begin`, one box holds the whole rows (outermost-axis slices) in the
// middle, at most ndim - 1 boxes start the sub-blocks before `end`. Each box is dense in row-major
// order, so a box stored contiguously has storage strides row_major_strides(shape) and storage
// offset linear_index(shape, box.origin) - begin relative to the run's first element.
//
// Example: shape (4, 3, 5) (60 elements), run [7, 52):
//   Box((0,1,2)+(1,1,3))   elements 7..9     (rest of row (0,1))
//   Box((0,2,0)+(1,1,5))   elements 10..14   (rest of block 0)
//   Box((1,0,0)+(2,3,5))   elements 15..44   (blocks 1 and 2)
//   Box((3,0,0)+(1,1,5))   elements 45..49
//   Box((3,1,0)+(1,1,2))   elements 50..51   -> 5 boxes = 2*3-1.
#pragma once

#include <cstdint>
#include <vector>

#include "core/affine/box.h"

namespace tessera::affine {

// Throws InvalidMapError unless 0 <= begin <= end <= shape.product(). A 0-d shape yields the single
// 0-d box when the run is [0, 1).
std::vector<Box> run_boxes(const Dims& shape, int64_t begin, int64_t end);

// Row-major linear index of `index` in `shape` (sum of index[k] * row_major_strides(shape)[k]).
int64_t linear_index(const Dims& shape, const Dims& index);

}  // namespace tessera::affine
