// A Box is an N-D half-open region of a tensor's index space: origin[k] <= i[k] < origin[k] + shape[k]
// ("end is exclusive") on every axis k, with 0 <= N <= 8 and int64 coordinates.
//
// Dims is the fixed-capacity vector (no heap) used for shapes, origins and strides everywhere in the
// affine layer, so that planning thousands of pieces allocates nothing per piece.
//
// Invariants: origin.size() == shape.size(); extents are >= 0; a box with any zero extent is empty
// (volume 0). A 0-d box (N == 0) has volume 1: it is the single element of a scalar tensor.
//
// Example: in a (8, 8) tensor, Box({4, 0}, {4, 2}) holds rows 4..7 of columns 0..1, 8 elements;
// its intersection with Box({0, 1}, {6, 8}) is Box({4, 1}, {2, 1}). to_string gives "Box((4,0)+(4,2))".
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace tessera::affine {

inline constexpr int kMaxDims = 8;

class Dims {
 public:
  Dims() = default;
  explicit Dims(int ndim, int64_t fill = 0);
  Dims(std::initializer_list<int64_t> values);
  explicit Dims(const std::vector<int64_t>& values);

  int size() const { return ndim_; }
  bool empty() const { return ndim_ == 0; }
  int64_t& operator[](int k) { return v_[k]; }
  int64_t operator[](int k) const { return v_[k]; }
  const int64_t* begin() const { return v_.data(); }
  const int64_t* end() const { return v_.data() + ndim_; }
  void push_back(int64_t value);
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }
  int64_t product() const;  // 1 for 0-d

  friend bool operator==(const Dims& a, const Dims& b);
  friend bool operator!=(const Dims& a, const Dims& b) { return !(a == b); }
  friend bool operator<(const Dims& a, const Dims& b);  // lexicographic, shorter first

 private:
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> v_{};
};

std::string to_string(const Dims& dims);  // "(4,0)"; "()" for 0-d
// Row-major (C-order) element strides of a shape: (8, 4, 2) -> (8, 2, 1).
Dims row_major_strides(const Dims& shape);

struct Box {
  Dims origin;
  Dims shape;

  Box() = default;
  Box(Dims origin_, Dims shape_);
  static Box whole(const Dims& tensor_shape);  // origin 0, shape = tensor_shape

  int ndim() const { return shape.size(); }
  int64_t volume() const;  // 0 when any extent is 0; 1 for 0-d
  bool is_empty() const { return volume() == 0; }
  int64_t end(int k) const { return origin[k] + shape[k]; }
  bool contains(const Box& other) const;  // every element of other lies in this box (empty: true)
  bool intersects(const Box& other) const;
  friend bool operator==(const Box& a, const Box& b) { return a.origin == b.origin && a.shape == b.shape; }
  friend bool operator!=(const Box& a, const Box& b) { return !(a == b); }
  friend bool operator<(const Box& a, const Box& b);
};

// Per-axis max of origins / min of ends; extents clamped at 0 (so the result may be empty).
Box intersect(const Box& a, const Box& b);
std::string to_string(const Box& box);  // "Box((4,0)+(4,2))"

}  // namespace tessera::affine
