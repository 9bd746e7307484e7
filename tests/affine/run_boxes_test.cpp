#include <catch2/catch.hpp>

#include <vector>

#include "core/affine/errors.h"
#include "core/affine/run_boxes.h"

using namespace tessera::affine;

namespace {

// Every element of [begin, end) exactly once, in row-major order, and nothing else.
void check_run(const Dims& shape, int64_t begin, int64_t end, size_t& worst) {
  const auto boxes = run_boxes(shape, begin, end);
  const int ndim = shape.size();
  REQUIRE(boxes.size() <= static_cast<size_t>(std::max(1, 2 * ndim - 1)));
  worst = std::max(worst, boxes.size());
  int64_t expected = begin;
  for (const auto& box : boxes) {
    REQUIRE(box.volume() > 0);
    REQUIRE(Box::whole(shape).contains(box));
    // Walk the box row-major: linear indices must continue the run (so the box is dense and its
    // storage offset is linear(origin) - begin with row-major strides).
    Dims index = box.origin;
    for (int64_t n = 0; n < box.volume(); ++n) {
      REQUIRE(linear_index(shape, index) == expected);
      ++expected;
      for (int k = ndim - 1; k >= 0; --k) {
        if (++index[k] < box.end(k)) break;
        index[k] = box.origin[k];
      }
    }
  }
  REQUIRE(expected == end);
}

}  // namespace

TEST_CASE("run_boxes: worked example of the header", "[affine][run_boxes]") {
  const auto boxes = run_boxes({4, 3, 5}, 7, 52);
  REQUIRE(boxes.size() == 5);
  CHECK(boxes[0] == Box({0, 1, 2}, {1, 1, 3}));
  CHECK(boxes[1] == Box({0, 2, 0}, {1, 1, 5}));
  CHECK(boxes[2] == Box({1, 0, 0}, {2, 3, 5}));
  CHECK(boxes[3] == Box({3, 0, 0}, {1, 1, 5}));
  CHECK(boxes[4] == Box({3, 1, 0}, {1, 1, 2}));
}

TEST_CASE("run_boxes: at most 2*ndim-1 dense boxes over ALL runs of several shapes", "[affine][run_boxes]") {
  // Exhaustive over every [begin, end) of each shape: the bound is proved for these shapes, and it is
  // attained (2*ndim-1 when the outer axis has >= 3 slices and inner axes >= 2;
  // the worst case of each shape is derived in its comment or equals that).
  const std::vector<std::pair<Dims, size_t>> shapes = {
      {{7}, 1},          {{3, 4}, 3},          {{4, 3, 5}, 5}, {{3, 3, 2, 3}, 7},
      {{3, 2, 2, 2, 2}, 9}, {{2, 3, 2, 3}, 6} /* 2 outer slices: no middle box */, {{3, 1, 4}, 3}, {{1, 5}, 1}};
  for (const auto& [shape, attained] : shapes) {
    size_t worst = 0;
    const int64_t n = shape.product();
    for (int64_t begin = 0; begin <= n; ++begin) {
      for (int64_t end = begin; end <= n; ++end) check_run(shape, begin, end, worst);
    }
    INFO("shape " << to_string(shape));
    CHECK(worst == attained);
  }
}

TEST_CASE("run_boxes: huge tensors, 0-d, refusals", "[affine][run_boxes]") {
  // A run of 10^9 x 8 costs nothing per element.
  const auto boxes = run_boxes({1000000000, 8}, 3, 7999999995);
  REQUIRE(boxes.size() == 3);
  CHECK(boxes[1] == Box({1, 0}, {999999998, 8}));
  CHECK(run_boxes(Dims(), 0, 1).size() == 1);
  CHECK(run_boxes({4, 4}, 5, 5).empty());
  CHECK_THROWS_AS(run_boxes({4, 4}, 3, 17), InvalidMapError);
  CHECK_THROWS_AS(run_boxes({4, 4}, 5, 4), InvalidMapError);
}
