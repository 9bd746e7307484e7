#include "core/affine/run_boxes.h"

#include "core/affine/errors.h"

namespace tessera::affine {
namespace {

// Appends the boxes of run [begin, end) of the sub-tensor shape[axis:], with `prefix` fixing the
// coordinates of axes < axis.
void cut(const Dims& shape, int axis, Dims& prefix, int64_t begin, int64_t end, std::vector<Box>& out) {
  if (begin >= end) return;
  const int ndim = shape.size();
  int64_t inner = 1;  // elements per slice of this axis
  for (int k = axis + 1; k < ndim; ++k) inner *= shape[k];
  auto emit = [&](int64_t first_slice, int64_t slices) {
    Box box(Dims(ndim), shape);
    for (int k = 0; k < axis; ++k) {
      box.origin[k] = prefix[k];
      box.shape[k] = 1;
    }
    box.origin[axis] = first_slice;
    box.shape[axis] = slices;
    out.push_back(box);
  };
  if (axis == ndim - 1) {
    emit(begin, end - begin);
    return;
  }
  int64_t first = begin / inner;
  const int64_t last = end / inner;  // slice holding `end` (may be one past the axis)
  const int64_t head = begin % inner;
  const int64_t tail = end % inner;
  if (first == last) {  // the whole run lies inside one slice
    prefix[axis] = first;
    cut(shape, axis + 1, prefix, head, tail, out);
    return;
  }
  if (head != 0) {
    prefix[axis] = first;
    cut(shape, axis + 1, prefix, head, inner, out);
    ++first;
  }
  if (last > first) emit(first, last - first);
  if (tail != 0) {
    prefix[axis] = last;
    cut(shape, axis + 1, prefix, 0, tail, out);
  }
}

}  // namespace

std::vector<Box> run_boxes(const Dims& shape, int64_t begin, int64_t end) {
  const int64_t numel = shape.product();
  if (begin < 0 || begin > end || end > numel) {
    throw InvalidMapError("run [" + std::to_string(begin) + ", " + std::to_string(end) + ") is outside a tensor of " +
                          std::to_string(numel) + " elements " + to_string(shape));
  }
  std::vector<Box> out;
  if (begin == end) return out;
  if (shape.size() == 0) {
    out.push_back(Box(Dims(), Dims()));
    return out;
  }
  Dims prefix(shape.size());
  cut(shape, 0, prefix, begin, end, out);
  return out;
}

int64_t linear_index(const Dims& shape, const Dims& index) {
  int64_t linear = 0;
  for (int k = 0; k < shape.size(); ++k) linear = linear * shape[k] + index[k];
  return linear;
}

}  // namespace tessera::affine
