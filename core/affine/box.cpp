#include "core/affine/box.h"

#include <algorithm>

#include "core/affine/errors.h"

namespace tessera::affine {

Dims::Dims(int ndim, int64_t fill) {
  if (ndim < 0 || ndim > kMaxDims) {
    throw UnsupportedLayoutError("a shape of " + std::to_string(ndim) + " axes is outside 0.." +
                                 std::to_string(kMaxDims));
  }
  ndim_ = ndim;
  for (int k = 0; k < ndim; ++k) v_[k] = fill;
}

Dims::Dims(std::initializer_list<int64_t> values) : Dims(std::vector<int64_t>(values)) {}

Dims::Dims(const std::vector<int64_t>& values) : Dims(static_cast<int>(values.size())) {
  for (int k = 0; k < ndim_; ++k) v_[k] = values[k];
}

void Dims::push_back(int64_t value) {
  if (ndim_ == kMaxDims) {
    throw UnsupportedLayoutError("more than " + std::to_string(kMaxDims) + " axes");
  }
  v_[ndim_++] = value;
}

int64_t Dims::product() const {
  int64_t p = 1;
  for (int k = 0; k < ndim_; ++k) p *= v_[k];
  return p;
}

bool operator==(const Dims& a, const Dims& b) {
  return a.ndim_ == b.ndim_ && std::equal(a.begin(), a.end(), b.begin());
}

bool operator<(const Dims& a, const Dims& b) {
  if (a.ndim_ != b.ndim_) return a.ndim_ < b.ndim_;
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
}

std::string to_string(const Dims& dims) {
  std::string out = "(";
  for (int k = 0; k < dims.size(); ++k) {
    if (k) out += ",";
    out += std::to_string(dims[k]);
  }
  return out + ")";
}

Dims row_major_strides(const Dims& shape) {
  Dims strides(shape.size());
  int64_t s = 1;
  for (int k = shape.size() - 1; k >= 0; --k) {
    strides[k] = s;
    s *= std::max<int64_t>(shape[k], 1);
  }
  return strides;
}

Box::Box(Dims origin_, Dims shape_) : origin(origin_), shape(shape_) {
  if (origin.size() != shape.size()) {
    throw InvalidMapError("a box with origin " + to_string(origin) + " and shape " + to_string(shape) +
                          " has different numbers of axes");
  }
}

Box Box::whole(const Dims& tensor_shape) { return Box(Dims(tensor_shape.size()), tensor_shape); }

int64_t Box::volume() const {
  int64_t v = 1;
  for (int k = 0; k < shape.size(); ++k) {
    if (shape[k] <= 0) return 0;
    v *= shape[k];
  }
  return v;
}

bool Box::contains(const Box& other) const {
  if (other.is_empty()) return true;
  for (int k = 0; k < ndim(); ++k) {
    if (other.origin[k] < origin[k] || other.end(k) > end(k)) return false;
  }
  return true;
}

bool Box::intersects(const Box& other) const {
  for (int k = 0; k < ndim(); ++k) {
    if (std::max(origin[k], other.origin[k]) >= std::min(end(k), other.end(k))) return false;
  }
  return !is_empty() && !other.is_empty();
}

bool operator<(const Box& a, const Box& b) {
  if (a.origin != b.origin) return a.origin < b.origin;
  return a.shape < b.shape;
}

Box intersect(const Box& a, const Box& b) {
  Box out = a;
  for (int k = 0; k < a.ndim(); ++k) {
    const int64_t lo = std::max(a.origin[k], b.origin[k]);
    const int64_t hi = std::min(a.end(k), b.end(k));
    out.origin[k] = lo;
    out.shape[k] = std::max<int64_t>(0, hi - lo);
  }
  return out;
}

std::string to_string(const Box& box) { return "Box(" + to_string(box.origin) + "+" + to_string(box.shape) + ")"; }

}  // namespace tessera::affine
