// BucketPlan against brute force: buckets tile exactly the reduced elements, in issue order, and
// list exactly the parameters they overlap.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "core/zero/bucket_plan.h"

using namespace tessera::zero;

TEST_CASE("Worked example from the header", "[zero][buckets]") {
  auto layout = make_flat_group_layout({"a", "b", "c", "d"}, {35, 7, 21, 3}, 3);
  auto ar = make_bucket_plan(layout, BucketShape::all_reduce, 30);
  REQUIRE(ar.buckets.size() == 3);
  CHECK((ar.buckets[0].begin == 36 && ar.buckets[0].end == 66));
  CHECK((ar.buckets[1].begin == 6 && ar.buckets[1].end == 36));
  CHECK((ar.buckets[2].begin == 0 && ar.buckets[2].end == 6));
  CHECK(ar.buckets[0].params == std::vector<int64_t>{1, 2, 3});  // b [35,42), c [42,63), d [63,66)
  CHECK(ar.param_buckets[0] == std::vector<int64_t>{1, 2});  // a [0,35) overlaps [6,36) and [0,6)
  auto rs = make_bucket_plan(layout, BucketShape::reduce_scatter, 30);
  REQUIRE(rs.buckets.size() == 3);
  CHECK((rs.buckets[0].begin == 12 && rs.buckets[0].end == 22));
  CHECK((rs.buckets[2].begin == 0 && rs.buckets[2].end == 2));
}

TEST_CASE("Random layouts: buckets tile the buffer and list their parameters exactly", "[zero][buckets]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t dp = 1 + rng() % 5, n = 1 + rng() % 6, bucket = 1 + rng() % 40;
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    for (int64_t i = 0; i < n; ++i) names.push_back("p" + std::to_string(i)), numels.push_back(rng() % 30);
    auto layout = make_flat_group_layout(names, numels, dp, 1 + rng() % 3);
    for (auto shape : {BucketShape::all_reduce, BucketShape::reduce_scatter}) {
      auto plan = make_bucket_plan(layout, shape, bucket);
      INFO("trial " << trial << " shape " << int(shape));
      const int64_t extent = shape == BucketShape::all_reduce ? layout.numel : layout.partition_numel;
      // Tiling from the end: bucket k ends where bucket k-1 begins.
      int64_t expected_end = extent;
      for (const auto& b : plan.buckets) {
        REQUIRE(b.end == expected_end);
        REQUIRE(b.begin < b.end);
        const int64_t width = (b.end - b.begin) * (shape == BucketShape::all_reduce ? 1 : dp);
        REQUIRE((width <= bucket || b.end - b.begin == 1));
        expected_end = b.begin;
        // Brute force: the parameters owning any element the bucket covers.
        std::set<int64_t> owners;
        for (int64_t r = 0; r < (shape == BucketShape::all_reduce ? 1 : dp); ++r) {
          const int64_t base = shape == BucketShape::all_reduce ? 0 : r * layout.partition_numel;
          for (int64_t e = base + b.begin; e < base + b.end; ++e)
            for (int64_t i = 0; i < n; ++i)
              if (e >= layout.params[i].offset && e < layout.params[i].offset + numels[i]) owners.insert(i);
        }
        REQUIRE(std::vector<int64_t>(owners.begin(), owners.end()) == b.params);
      }
      REQUIRE(expected_end == 0);
      for (int64_t i = 0; i < n; ++i) REQUIRE(plan.param_buckets[i].empty() == (numels[i] == 0));
    }
  }
}
