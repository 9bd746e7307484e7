#include <catch2/catch.hpp>

#include "core/affine/builders.h"
#include "core/affine/errors.h"
#include "core/affine/nest.h"
#include "core/affine/planner.h"
#include "core/affine/validate.h"
#include "core/affine/zero_storage.h"
#include "oracle.h"

using namespace tessera::affine;
namespace affine = tessera::affine;
using namespace tessera::affine::testing;

TEST_CASE("nest: TP2 rows x ZeRO-3 over DP2 (header example)", "[affine][nest]") {
  const TensorInfo info{"w", DType::f32, {8, 4}};
  const TensorMap layout = contiguous_split(info, 0, {4, 4});
  std::map<int, TensorMap> storage;
  for (int t = 0; t < 2; ++t) storage[t] = zero3_partition({"w", DType::f32, {4, 4}}, 2);
  const TensorMap map = nest(layout, storage, [](int t, int s) { return t * 2 + s; });
  validate_map(map);
  REQUIRE(map.ranks.at(1).pieces.size() == 1);
  CHECK(map.ranks.at(1).pieces[0].box == Box({2, 0}, {2, 4}));
  CHECK(map.ranks.at(1).pieces[0].strides == Dims({4, 1}));
  CHECK(map.ranks.at(3).pieces[0].box == Box({6, 0}, {2, 4}));
}

TEST_CASE("nest equals the two-step model: TP layouts x ZeRO storage, element by element", "[affine][nest]") {
  // Oracle: global rank g = (t, s) must store at address a exactly what storage rank s of shard t
  // stores at a, where shard t's element j is the tensor element layout rank t stores at address j.
  struct Case {
    TensorMap layout;
    std::string storage_kind;
    int dp;
  };
  const TensorInfo qkv{"qkv", DType::f32, {24, 6}};
  std::vector<Case> cases = {
      {contiguous_split({"w", DType::f32, {9, 7}}, 0, {5, 4}), "zero3", 3},
      {contiguous_split({"w", DType::f32, {9, 7}}, 1, {3, 4}), "zero3", 2},
      {contiguous_split({"w", DType::f32, {9, 7}}, 1, {3, 4}), "zero12", 4},
      {sub_param_split_even(qkv, 0, {16, 4, 4}, 2), "zero3", 4},
      {sub_param_split_even(qkv, 0, {16, 4, 4}, 2), "zero12", 3},
      {replicated({"norm", DType::f32, {10}}, 2), "zero3", 4},
      {replicated({"norm", DType::f32, {10}}, 2), "replicated", 4},
      {contiguous_split({"e", DType::f32, {11, 3, 2}}, 0, {6, 5}), "zero3", 4},
  };
  for (auto& c : cases) {
    std::map<int, TensorMap> storage;
    for (const auto& [t, st] : c.layout.ranks) {
      const TensorInfo shard{c.layout.name, c.layout.dtype, st.buffer_shape};
      if (c.storage_kind == "zero3") storage[t] = zero3_partition(shard, c.dp);
      if (c.storage_kind == "zero12") storage[t] = zero12_flat_group({{"pre", DType::f32, {3}}, shard}, c.dp)[1];
      if (c.storage_kind == "replicated") storage[t] = replicated(shard, c.dp);
    }
    const int dp = c.dp;
    const TensorMap map = nest(c.layout, storage, [dp](int t, int s) { return t * dp + s; });
    INFO(c.layout.name << " x " << c.storage_kind << " dp " << dp);
    validate_map(map);
    const RankBuffers layout_values = make_source_buffers(c.layout, 0);
    const RankBuffers nested_values = make_source_buffers(map, 0);
    for (const auto& [t, inner] : storage) {
      const uint32_t* shard = layout_values.at(t).data();
      for (const auto& [s, st] : inner.ranks) {
        std::vector<uint32_t> expected(static_cast<size_t>(st.buffer_elements), 0);
        for (const auto& p : st.pieces) {
          for_each_element(inner.shape, p, [&](int64_t linear, int64_t address) {
            expected[static_cast<size_t>(address)] = shard[linear];
          });
        }
        const PaddedBuffer& got = nested_values.at(t * dp + s);
        CHECK(std::vector<uint32_t>(got.data(), got.data() + got.elements) == expected);
        // Each stored run stays a handful of boxes per layout piece.
        CHECK(map.ranks.at(t * dp + s).pieces.size() <=
              c.layout.ranks.at(t).pieces.size() * static_cast<size_t>(2 * map.shape.size() - 1));
      }
    }
  }
}

TEST_CASE("nest: replicated layout x replicated storage gives one holder set of all global ranks", "[affine][nest]") {
  const TensorMap layout = replicated({"norm", DType::f32, {16}}, 2);
  std::map<int, TensorMap> storage{{0, replicated({"norm", DType::f32, {16}}, 4)},
                                   {1, replicated({"norm", DType::f32, {16}}, 4)}};
  const TensorMap map = nest(layout, storage, [](int t, int s) { return s * 2 + t; });
  for (const auto& [rank, st] : map.ranks) {
    REQUIRE(st.pieces.size() == 1);
    CHECK(st.pieces[0].holders == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  }
  CHECK_THROWS_AS(nest(layout, storage, [](int, int s) { return s; }), InvalidMapError);  // two shards on one rank
  CHECK_THROWS_AS(nest(layout, {{0, storage.at(0)}}, [](int t, int s) { return t * 4 + s; }), InvalidMapError);
}

TEST_CASE("refold merges pieces that continue in tensor and storage", "[affine][nest]") {
  TensorMap map;
  map.name = "w";
  map.shape = {4, 8};
  map.ranks[0].buffer_elements = 32;
  for (int64_t row = 0; row < 4; ++row) map.ranks[0].pieces.push_back(Piece{Box({row, 0}, {1, 8}), row * 8, {8, 1}, {0}});
  refold(map);
  REQUIRE(map.ranks[0].pieces.size() == 1);
  CHECK(map.ranks[0].pieces[0].box == Box({0, 0}, {4, 8}));
}

TEST_CASE("nest: replicated segments inside TP shards of different sizes, each under its own ZeRO-3",
          "[affine][nest]") {
  // bigcode-like: query rows split unevenly [12, 8, 8, 4] over TP4, KV rows replicated; each shard has
  // a different size, so ZeRO-3 over DP2 cuts the replicated KV rows at different places per shard.
  const TensorMap layout = segmented({"c_attn", DType::f32, {48, 8}}, 0,
                                     {LayoutSegment{32, false, {12, 8, 8, 4}}, LayoutSegment{16, true, {}}}, 4);
  std::map<int, TensorMap> storage;
  for (const auto& [t, st] : layout.ranks) storage[t] = zero3_partition({"c_attn", DType::f32, st.buffer_shape}, 2);
  const TensorMap map = nest(layout, storage, [](int t, int s) { return t * 2 + s; });
  validate_map(map);  // holders are exact per common box
  // Some KV element is held by ranks from all four TP shards.
  bool all_shards = false;
  for (const auto& [rank, st] : map.ranks)
    for (const auto& p : st.pieces) all_shards = all_shards || p.holders.size() == 4;
  CHECK(all_shards);
  for (int tp : {1, 2, 4}) {
    const TensorMap target = contiguous_split({"c_attn", DType::f32, {48, 8}}, 0, even_split_sizes(48, tp));
    for (const auto& policy : {ReplicaPolicy::lowest(), ReplicaPolicy::balanced()}) {
      PlanOptions o;
      o.policy = policy;
      CHECK(check_transfer(target, map, affine::plan(target, map, o)).empty());
    }
  }
}
