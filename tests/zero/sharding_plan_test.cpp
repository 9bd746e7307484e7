// ShardingPlan against independent derivations: the affine layer's own ZeRO-1/2 builder
// (zero12_flat_group) for the partitioned maps, replicated() shifted by each parameter's offset
// for the weights, brute force for sub-groups and bucket ownership; plus the header's example
// and the refusals.
#include <catch2/catch.hpp>

#include <random>

#include "core/affine/builders.h"
#include "core/affine/validate.h"
#include "core/affine/zero_storage.h"
#include "core/error.h"
#include "core/zero/sharding_plan.h"

using namespace tessera;
using namespace tessera::zero;

namespace {

PlannedParameter param(std::string name, std::vector<int64_t> shape, int64_t group = 0, bool low = false) {
  return {std::move(name), std::move(shape), group, low};
}

}  // namespace

TEST_CASE("Sharding plan: the header's example", "[zero][plan]") {
  ShardingPlanOptions o;
  o.stage = 2, o.world = 2, o.bucket_elements = 8, o.sub_group_elements = 5;
  ShardingPlan plan({param("a", {3, 5}), param("b", {7})}, o);
  REQUIRE(plan.groups().size() == 1);
  const auto& g = plan.groups()[0];
  CHECK(g.layout.padded_numel == 24);
  CHECK(g.layout.partition_numel == 12);
  REQUIRE(g.sub_groups.size() == 3);
  CHECK((g.sub_groups[2].begin == 10 && g.sub_groups[2].end == 12));
  CHECK(plan.partitioned_gradients());
  const auto& buckets = plan.buckets().buckets;
  REQUIRE(buckets.size() == 4);
  CHECK((buckets[0].begin == 14 && buckets[0].end == 22 && buckets[0].owner == 1));
  CHECK((buckets[1].begin == 12 && buckets[1].end == 14 && buckets[1].owner == 1));
  CHECK((buckets[3].begin == 0 && buckets[3].end == 4 && buckets[3].owner == 0));
  const auto maps = plan.partition_maps(0, affine::DType::f32);
  REQUIRE(maps.size() == 2);
  const auto& a = maps[0];
  REQUIRE(a.ranks.at(0).pieces.size() == 2);
  CHECK(a.ranks.at(0).pieces[1].box == affine::Box(affine::Dims({2, 0}), affine::Dims({1, 2})));
  CHECK(a.ranks.at(0).pieces[1].offset == 10);
  REQUIRE(a.ranks.at(1).pieces.size() == 1);
  CHECK(a.ranks.at(1).pieces[0].box == affine::Box(affine::Dims({2, 2}), affine::Dims({1, 3})));
  CHECK(a.ranks.at(1).pieces[0].offset == 0);
}

TEST_CASE("Sharding plan: bucket size 0 is one bucket per parameter (DeepSpeed's reduce_bucket_size 0)", "[zero][plan]") {
  ShardingPlanOptions o;
  o.stage = 1, o.world = 2, o.bucket_elements = 0, o.sub_group_elements = 5;
  ShardingPlan one({param("a", {3, 5}), param("b", {7})}, o);
  const auto& all_reduce = one.buckets().buckets;
  REQUIRE(all_reduce.size() == 2);  // b [15, 22), then a [0, 15)
  CHECK((all_reduce[0].begin == 15 && all_reduce[0].end == 22 && all_reduce[0].params == std::vector<int64_t>{1}));
  CHECK((all_reduce[1].begin == 0 && all_reduce[1].end == 15 && all_reduce[1].params == std::vector<int64_t>{0}));
  // Stage 2: also cut at the partitions and into pieces of at most kMaxStagedBucketElements.
  o.stage = 2;
  ShardingPlan two({param("a", {3, 5}), param("b", {7}), param("big", {kMaxStagedBucketElements + 2})}, o);
  const auto& to_owner = two.buckets().buckets;
  for (const auto& b : to_owner) {
    CHECK(b.params.size() == 1);
    CHECK(b.elements() <= kMaxStagedBucketElements);
  }
  // Partitions of 524300 elements: big [22, 1048600) is cut at 524300 and into pieces; a and b whole.
  REQUIRE(to_owner.size() >= 4);
  CHECK((to_owner.back().begin == 0 && to_owner.back().end == 15));
  CHECK((to_owner[to_owner.size() - 2].begin == 15 && to_owner[to_owner.size() - 2].end == 22));
  CHECK(to_owner[to_owner.size() - 3].params == std::vector<int64_t>{2});
  o.bucket_elements = -1;
  CHECK_THROWS_WITH(ShardingPlan({param("a", {3})}, o), Catch::Contains("bucket size -1"));
}

TEST_CASE("Sharding plan: maps equal the affine layer's ZeRO builders on random models", "[zero][plan]") {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 150; ++trial) {
    ShardingPlanOptions o;
    o.stage = int64_t(rng() % 3), o.world = 1 + int(rng() % 4);
    o.bucket_elements = 1 + int64_t(rng() % 50), o.sub_group_elements = 1 + int64_t(rng() % 40);
    const int groups = 1 + int(rng() % 2);
    std::vector<PlannedParameter> ps;
    const int n = groups + int(rng() % 5);
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> shape;
      for (int d = 0, nd = 1 + int(rng() % 3); d < nd; ++d) shape.push_back(1 + int64_t(rng() % 5));
      ps.push_back(param("p" + std::to_string(i), shape, i < groups ? i : int64_t(rng() % groups), rng() % 4 == 0));
    }
    INFO("trial " << trial << " stage " << o.stage << " world " << o.world);
    ShardingPlan plan(ps, o);
    std::vector<int> seen(ps.size(), 0);
    for (size_t g = 0; g < plan.groups().size(); ++g) {
      const auto& group = plan.groups()[g];
      std::vector<affine::TensorInfo> infos;
      for (auto i : group.params) {
        ++seen[size_t(i)];
        CHECK(plan.place(i).first == int64_t(g));
        CHECK(ps[size_t(i)].param_group == group.param_group);
        CHECK(ps[size_t(i)].lower_precision == group.lower_precision);
        infos.push_back({ps[size_t(i)].name, affine::DType::f32, affine::Dims(ps[size_t(i)].shape)});
      }
      // Partitioned kinds: zero12_flat_group at stages >= 1; at stage 0 one partition on every rank.
      auto expected = o.stage >= 1 ? affine::zero12_flat_group(infos, o.world, 2) : affine::zero12_flat_group(infos, 1, 1);
      if (o.stage == 0) {
        for (auto& m : expected) {
          const auto storage = m.ranks.at(0);
          for (int r = 0; r < o.world; ++r) m.ranks[r] = storage;
          affine::assign_holders_by_box(m);
        }
      }
      const auto partitioned = plan.partition_maps(int64_t(g), affine::DType::f32);
      REQUIRE(partitioned.size() == expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        CHECK(partitioned[i] == expected[i]);
        CHECK_NOTHROW(affine::validate_map(partitioned[i]));
      }
      // Weights: replicated, shifted to the slot in the padded flat buffer.
      const auto weights = plan.weight_maps(int64_t(g), affine::DType::f32);
      for (size_t i = 0; i < infos.size(); ++i) {
        auto m = affine::replicated(infos[i], o.world);
        for (auto& [rank, storage] : m.ranks) {
          storage.buffer_elements = group.layout.padded_numel;
          storage.buffer_shape = affine::Dims();
          for (auto& piece : storage.pieces) piece.offset += group.layout.params[i].offset;
        }
        CHECK(weights[i] == m);
      }
      // Sub-groups tile the partition in runs of at most sub_group_elements.
      int64_t next = 0;
      for (const auto& s : group.sub_groups) {
        CHECK(s.begin == next);
        CHECK((s.elements() > 0 && s.elements() <= o.sub_group_elements));
        next = s.end;
      }
      CHECK(next == group.layout.partition_numel);
    }
    for (int count : seen) CHECK(count == 1);
    // Buckets reduce to the owner of the partition holding them exactly when gradients are partitioned.
    for (const auto& b : plan.buckets().buckets) {
      const auto& layout = plan.groups()[size_t(b.group)].layout;
      if (plan.partitioned_gradients()) {
        CHECK(b.owner == b.begin / layout.partition_numel);
        CHECK((b.end - 1) / layout.partition_numel == b.owner);
      } else {
        CHECK(b.owner == -1);
      }
    }
  }
}

TEST_CASE("Sharding plan: refusals name what is wrong", "[zero][plan]") {
  ShardingPlanOptions o;
  CHECK_THROWS_WITH(ShardingPlan({}, o), Catch::Contains("no parameters"));
  o.stage = 4;
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2})}, o), Catch::Contains("ZeRO stage 4"));
  o.stage = 1, o.world = 0;
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2})}, o), Catch::Contains("data-parallel size 0"));
  o.world = 2, o.bucket_elements = -1;  // 0 is one bucket per parameter; the sub-group size is required
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2})}, o), Catch::Contains("bucket size -1"));
  o.bucket_elements = 10;
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2})}, o), Catch::Contains("sub-group size"));
  o.sub_group_elements = 10;
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2}, 0), param("b", {2}, 2)}, o), Catch::Contains("parameter group 1"));
}
