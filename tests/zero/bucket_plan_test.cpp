// BucketPlan against brute force: buckets tile exactly the reduced elements, in issue order, and
// list exactly the parameters they overlap.
#include <catch2/catch.hpp>

#include <random>
#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

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
  for (const auto& b : ar.buckets) CHECK(b.owner == -1);
  // Reduce-to-owner (P = 22): one bucket per partition at bucket_elements 30...
  auto ro = make_bucket_plan(layout, BucketShape::reduce_to_owner, 30);
  REQUIRE(ro.buckets.size() == 3);
  CHECK((ro.buckets[0].begin == 44 && ro.buckets[0].end == 66 && ro.buckets[0].owner == 2));
  CHECK((ro.buckets[1].begin == 22 && ro.buckets[1].end == 44 && ro.buckets[1].owner == 1));
  CHECK((ro.buckets[2].begin == 0 && ro.buckets[2].end == 22 && ro.buckets[2].owner == 0));
  // ... and at 10, cut at the partition boundaries too.
  ro = make_bucket_plan(layout, BucketShape::reduce_to_owner, 10);
  REQUIRE(ro.buckets.size() == 9);
  CHECK((ro.buckets[2].begin == 44 && ro.buckets[2].end == 46 && ro.buckets[2].owner == 2));
  CHECK((ro.buckets[3].begin == 34 && ro.buckets[3].end == 44 && ro.buckets[3].owner == 1));
}

TEST_CASE("Random layouts: buckets tile the buffer and list their parameters exactly", "[zero][buckets]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t dp = 1 + rng() % 5, n = 1 + rng() % 6, bucket = 1 + rng() % 40;
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    for (int64_t i = 0; i < n; ++i) names.push_back("p" + std::to_string(i)), numels.push_back(rng() % 30);
    auto layout = make_flat_group_layout(names, numels, dp, 1 + rng() % 3);
    for (auto shape : {BucketShape::all_reduce, BucketShape::reduce_to_owner}) {
      auto plan = make_bucket_plan(layout, shape, bucket);
      INFO("trial " << trial << " shape " << int(shape));
      // Tiling from the end: bucket k ends where bucket k-1 begins; padding is never covered.
      int64_t expected_end = layout.numel;
      for (const auto& b : plan.buckets) {
        REQUIRE(b.end == expected_end);
        REQUIRE(b.begin < b.end);
        REQUIRE(b.elements() <= bucket);
        if (shape == BucketShape::all_reduce) {
          REQUIRE(b.owner == -1);
        } else {
          // Inside the owner's partition, and as long as it may be there.
          REQUIRE(b.owner == b.begin / layout.partition_numel);
          REQUIRE(b.end <= (b.owner + 1) * layout.partition_numel);
          REQUIRE((b.elements() == bucket || b.begin == b.owner * layout.partition_numel));
        }
        expected_end = b.begin;
        // Brute force: the parameters owning any element the bucket covers.
        std::set<int64_t> owners;
        for (int64_t e = b.begin; e < b.end; ++e)
          for (int64_t i = 0; i < n; ++i)
            if (e >= layout.params[i].offset && e < layout.params[i].offset + numels[i]) owners.insert(i);
        REQUIRE(std::vector<int64_t>(owners.begin(), owners.end()) == b.params);
      }
      REQUIRE(expected_end == 0);
      for (int64_t i = 0; i < n; ++i) REQUIRE(plan.param_buckets[i].empty() == (numels[i] == 0));
    }
  }
}

TEST_CASE("Per-parameter cut (reduce_bucket_size 0): the header's example", "[zero][buckets]") {
  const auto layout = make_flat_group_layout({"a", "b", "c", "d"}, {35, 13, 24, 1}, 3);  // P = 25
  const int64_t unbounded = std::numeric_limits<int64_t>::max();
  using Range = std::tuple<int64_t, int64_t, int>;
  auto ranges = [](const BucketPlan& plan) {
    std::vector<Range> out;
    for (const auto& b : plan.buckets) out.emplace_back(b.begin, b.end, b.owner);
    return out;
  };
  const auto ar = make_bucket_plan(layout, BucketShape::all_reduce, unbounded, BucketCut::per_parameter);
  CHECK(ranges(ar) == std::vector<Range>{{72, 73, -1}, {48, 72, -1}, {35, 48, -1}, {0, 35, -1}});
  for (int64_t p = 0; p < 4; ++p) CHECK(ar.param_buckets[p] == std::vector<int64_t>{3 - p});
  const auto ro = make_bucket_plan(layout, BucketShape::reduce_to_owner, unbounded, BucketCut::per_parameter);
  CHECK(ranges(ro) ==
        std::vector<Range>{{72, 73, 2}, {50, 72, 2}, {48, 50, 1}, {35, 48, 1}, {25, 35, 1}, {0, 25, 0}});
  // A size still bounds the pieces: c [48, 72) in pieces of at most 10 inside partition 2.
  const auto bounded = make_bucket_plan(layout, BucketShape::reduce_to_owner, 10, BucketCut::per_parameter);
  CHECK(ranges(bounded)[1] == Range{62, 72, 2});
  CHECK(ranges(bounded)[3] == Range{50, 52, 2});
}

TEST_CASE("Per-parameter cut on random layouts: every bucket inside one parameter, as large as it may be",
          "[zero][buckets]") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t dp = 1 + rng() % 5, n = 1 + rng() % 6, bucket = 1 + rng() % 40;
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    for (int64_t i = 0; i < n; ++i) names.push_back("p" + std::to_string(i)), numels.push_back(rng() % 30);
    const auto layout = make_flat_group_layout(names, numels, dp, 1 + rng() % 3);
    for (auto shape : {BucketShape::all_reduce, BucketShape::reduce_to_owner}) {
      const auto plan = make_bucket_plan(layout, shape, bucket, BucketCut::per_parameter);
      INFO("trial " << trial << " shape " << int(shape));
      int64_t expected_end = layout.numel;
      for (const auto& b : plan.buckets) {
        REQUIRE(b.end == expected_end);
        REQUIRE(b.params.size() == 1);
        const auto& slot = layout.params[b.params[0]];
        REQUIRE((slot.offset <= b.begin && b.end <= slot.offset + slot.numel));
        REQUIRE(b.elements() <= bucket);
        // Cut only where a limit is: the size, the parameter's start, or the owner's partition.
        const int64_t partition_start = shape == BucketShape::reduce_to_owner ? b.owner * layout.partition_numel : 0;
        REQUIRE((b.elements() == bucket || b.begin == slot.offset || b.begin == partition_start));
        expected_end = b.begin;
      }
      REQUIRE(expected_end == 0);
    }
  }
}

TEST_CASE("Several groups: one plan, merged by the latest parameter, model-wide indices", "[zero][buckets]") {
  // Model order a0 b1 a2 b3: group A holds {0, 2}, group B {1, 3}.
  auto a = make_flat_group_layout({"a0", "a2"}, {10, 10}, 2);
  auto b = make_flat_group_layout({"b1", "b3"}, {10, 10}, 2);
  auto plan = make_bucket_plan({a, b}, {{0, 2}, {1, 3}}, BucketShape::all_reduce, 10);
  REQUIRE(plan.buckets.size() == 4);
  // Latest parameter first: b3, a2, b1, a0.
  CHECK((plan.buckets[0].group == 1 && plan.buckets[0].params == std::vector<int64_t>{3}));
  CHECK((plan.buckets[1].group == 0 && plan.buckets[1].params == std::vector<int64_t>{2}));
  CHECK((plan.buckets[2].group == 1 && plan.buckets[2].params == std::vector<int64_t>{1}));
  CHECK((plan.buckets[3].group == 0 && plan.buckets[3].params == std::vector<int64_t>{0}));
  CHECK(plan.param_buckets[2] == std::vector<int64_t>{1});
  // A bucket spanning two parameters takes the latest as its key; reduce-to-owner likewise (each
  // group's partitions of 10 are one bucket each).
  auto ro = make_bucket_plan({a, b}, {{0, 2}, {1, 3}}, BucketShape::reduce_to_owner, 40);
  REQUIRE(ro.buckets.size() == 4);
  CHECK((ro.buckets[0].group == 1 && ro.buckets[0].owner == 1 && ro.buckets[1].group == 0));
  CHECK(ro.param_buckets[0] == std::vector<int64_t>{3});
  // Bad numberings are refused.
  CHECK_THROWS(make_bucket_plan({a, b}, {{0, 2}, {2, 3}}, BucketShape::all_reduce, 10));
  CHECK_THROWS(make_bucket_plan({a, b}, {{2, 0}, {1, 3}}, BucketShape::all_reduce, 10));
  CHECK_THROWS(make_bucket_plan({a}, {{0, 1}, {2}}, BucketShape::all_reduce, 10));
}

TEST_CASE("Random group splits: every bucket of every group once, merged by their latest parameter", "[zero][buckets]") {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t n = 3 + rng() % 8, groups = 1 + rng() % 3, dp = 1 + rng() % 3;
    std::vector<std::vector<int64_t>> ids(groups);
    std::vector<std::vector<std::string>> names(groups);
    std::vector<std::vector<int64_t>> numels(groups);
    for (int64_t i = 0; i < n; ++i) {
      const auto g = i < groups ? i : int64_t(rng() % groups);  // no group is empty
      ids[g].push_back(i), names[g].push_back("p" + std::to_string(i)), numels[g].push_back(1 + rng() % 20);
    }
    std::vector<FlatGroupLayout> layouts;
    for (int64_t g = 0; g < groups; ++g) layouts.push_back(make_flat_group_layout(names[g], numels[g], dp));
    for (auto shape : {BucketShape::all_reduce, BucketShape::reduce_to_owner}) {
      const int64_t size = 1 + rng() % 25;
      auto plan = make_bucket_plan(layouts, ids, shape, size);
      // Exactly each group's own buckets (same ranges), in some order.
      std::multiset<std::tuple<int64_t, int64_t, int64_t>> expected, got;
      for (int64_t g = 0; g < groups; ++g)
        for (const auto& b : make_bucket_plan(layouts[g], shape, size).buckets) expected.insert({g, b.begin, b.end});
      for (const auto& b : plan.buckets) got.insert({b.group, b.begin, b.end});
      REQUIRE(got == expected);
      // Each group's buckets keep their own order, and every pick is the latest head of all groups.
      std::vector<size_t> head(groups, 0);
      std::vector<std::vector<Bucket>> own;
      for (int64_t g = 0; g < groups; ++g) own.push_back(make_bucket_plan(layouts[g], shape, size).buckets);
      for (const auto& bucket : plan.buckets) {
        INFO("group " << bucket.group << " [" << bucket.begin << ", " << bucket.end << ")");
        REQUIRE_FALSE(bucket.params.empty());
        const auto& mine = own[bucket.group][head[bucket.group]];
        REQUIRE((mine.begin == bucket.begin && mine.end == bucket.end));
        for (int64_t g = 0; g < groups; ++g)
          if (head[g] < own[g].size() && g != bucket.group)
            REQUIRE(ids[g][own[g][head[g]].params.back()] < bucket.params.back());
        ++head[bucket.group];
        for (auto p : bucket.params)
          REQUIRE(std::find(ids[bucket.group].begin(), ids[bucket.group].end(), p) != ids[bucket.group].end());
      }
      for (int64_t i = 0; i < n; ++i) REQUIRE_FALSE(plan.param_buckets[i].empty());
    }
  }
}

TEST_CASE("Staging copies: packing parameters by the copies equals packing the flat buffer", "[zero][buckets]") {
  // Header example: bucket [18, 22), parameter at flat [20, 42).
  auto example = make_flat_group_layout({"a", "b", "c"}, {20, 22, 24}, 3);
  Bucket bucket{18, 22, {}};
  auto copy = staging_copy(example, bucket, 1);
  CHECK((copy.param_begin == 0 && copy.staging_begin == 2 && copy.length == 2));
  CHECK(staging_copy(example, bucket, 2).length == 0);
  // Brute force over random layouts: element e of the flat buffer holds its own index; packing
  // every parameter through the copies must reproduce the bucket's range.
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t dp = 1 + rng() % 4, n = 1 + rng() % 5;
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    for (int64_t i = 0; i < n; ++i) names.push_back("p" + std::to_string(i)), numels.push_back(rng() % 25);
    auto layout = make_flat_group_layout(names, numels, dp, 1 + rng() % 2);
    for (auto shape : {BucketShape::all_reduce, BucketShape::reduce_to_owner}) {
      auto plan = make_bucket_plan(layout, shape, 1 + rng() % 30);
      for (const auto& b : plan.buckets) {
        std::vector<int64_t> expected(b.elements(), -1), got(b.elements(), -1);
        for (int64_t e = 0; e < b.elements(); ++e) expected[e] = b.begin + e;
        for (int64_t i = 0; i < n; ++i) {
          const auto c = staging_copy(layout, b, i);
          for (int64_t k = 0; k < c.length; ++k) {
            REQUIRE(got[c.staging_begin + k] == -1);  // no element written twice
            got[c.staging_begin + k] = layout.params[i].offset + c.param_begin + k;
          }
        }
        REQUIRE(got == expected);
      }
    }
  }
}
