#include <catch2/catch.hpp>

#include "core/affine/box.h"
#include "core/affine/errors.h"

using namespace tessera::affine;

TEST_CASE("Box volume, emptiness, containment and intersection", "[affine][box]") {
  const Box a({4, 0}, {4, 2});  // rows 4..7, cols 0..1
  CHECK(a.volume() == 8);
  CHECK_FALSE(a.is_empty());
  CHECK(to_string(a) == "Box((4,0)+(4,2))");
  // Intersection with rows 0..5, cols 1..8: rows 4..5, col 1.
  CHECK(intersect(a, Box({0, 1}, {6, 8})) == Box({4, 1}, {2, 1}));
  CHECK(intersect(a, Box({0, 2}, {8, 2})).is_empty());  // touching, not overlapping
  CHECK_FALSE(a.intersects(Box({0, 2}, {8, 2})));
  CHECK(Box::whole({8, 8}).contains(a));
  CHECK_FALSE(a.contains(Box({3, 0}, {2, 1})));
  CHECK(a.contains(Box({0, 0}, {0, 5})));  // empty boxes are contained anywhere
  CHECK(Box({0, 0}, {3, 0}).is_empty());
  CHECK(Box(Dims(), Dims()).volume() == 1);  // 0-d: the single element of a scalar
}

TEST_CASE("Dims: row-major strides, limits", "[affine][box]") {
  CHECK(row_major_strides({8, 4, 2}) == Dims({8, 2, 1}));
  CHECK(row_major_strides({3, 0, 5}) == Dims({5, 5, 1}));  // zero extents do not zero the strides
  CHECK(Dims({1, 2, 3}).product() == 6);
  CHECK(Dims().product() == 1);
  Dims d(8);
  CHECK_THROWS_AS(d.push_back(1), UnsupportedLayoutError);
  CHECK_THROWS_AS(Dims(9), UnsupportedLayoutError);
  CHECK_THROWS_AS(Box(Dims({1, 2}), Dims({1})), InvalidMapError);
}
