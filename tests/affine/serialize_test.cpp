#include <catch2/catch.hpp>

#include "core/affine/builders.h"
#include "core/affine/errors.h"
#include "core/affine/nest.h"
#include "core/affine/planner.h"
#include "core/affine/serialize.h"
#include "core/affine/validate.h"
#include "core/affine/zero_storage.h"

using namespace tessera::affine;
namespace affine = tessera::affine;

namespace {

TensorMap sample_map() {
  const TensorMap layout = sub_param_split_even({"model.layers.0.self_attn.qkv.weight", DType::bf16, {24, 6}}, 0,
                                                {16, 4, 4}, 2);
  std::map<int, TensorMap> storage;
  for (const auto& [t, st] : layout.ranks) storage[t] = zero3_partition({layout.name, DType::bf16, st.buffer_shape}, 3);
  return nest(layout, storage, [](int t, int s) { return t * 3 + s; });
}

}  // namespace

TEST_CASE("maps and plans round-trip exactly through JSON", "[affine][serialize]") {
  const TensorMap map = sample_map();
  const std::string text = map_to_json(map);
  CHECK(map_from_json(text) == map);
  CHECK(map_to_json(map_from_json(text)) == text);
  const auto set = maps_from_json(maps_to_json({map, replicated({"norm", DType::f32, {7}}, 2)}, 2));
  REQUIRE(set.size() == 2);
  CHECK(set[0] == map);
  // 64-bit offsets survive.
  const TensorMap huge = contiguous_split({"big", DType::f32, {1000000000, 8}}, 0, {600000000, 400000000});
  CHECK(map_from_json(map_to_json(huge)) == huge);

  PlanOptions balanced;
  balanced.policy = ReplicaPolicy::balanced();
  const Plan plan = affine::plan(contiguous_split({map.name, DType::bf16, {24, 6}}, 1, {2, 2, 2}), map, balanced);
  const Plan back = plan_from_json(plan_to_json(plan));
  CHECK(back == plan);
  CHECK(back.digest() == plan.digest());
  const auto plans = plans_from_json(plans_to_json({plan, plan}));
  CHECK(plans.size() == 2);
  CHECK(hex_digest(0x1234) == "0000000000001234");
}

TEST_CASE("corrupting one field of a serialized map or plan is refused", "[affine][serialize]") {
  const TensorMap map = sample_map();
  validate_map(map);
  const std::string text = map_to_json(map);
  auto corrupt = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    return t;
  };
  // Refused while reading: a field renamed, a wrong type, an unknown dtype, not JSON at all.
  CHECK_THROWS_AS(map_from_json(corrupt("\"offset\"", "\"ofset\"")), FormatError);
  CHECK_THROWS_AS(map_from_json(corrupt("\"offset\":0", "\"offset\":\"0\"")), FormatError);
  CHECK_THROWS_AS(map_from_json(corrupt("\"bf16\"", "\"bf17\"")), FormatError);
  CHECK_THROWS_AS(map_from_json(text.substr(0, text.size() / 2)), FormatError);
  CHECK_THROWS_AS(map_from_json(corrupt("\"version\":1", "\"version\":2")), FormatError);
  // Refused by validation: the map reads, but contradicts itself.
  CHECK_THROWS_AS(validate_map(map_from_json(corrupt("\"strides\":[6,1]", "\"strides\":[1,6]"))), tessera::MapError);
  CHECK_THROWS_AS(validate_map(map_from_json(corrupt("\"holders\":[0]", "\"holders\":[1]"))), HolderError);
  CHECK_THROWS_AS(validate_map(map_from_json(corrupt("\"buffer_elements\":24", "\"buffer_elements\":23"))), tessera::MapError);
  CHECK_THROWS_AS(validate_map(map_from_json(corrupt("\"shape\":[24,6]", "\"shape\":[24,7]"))), tessera::MapError);

  const Plan plan = affine::plan(contiguous_split({map.name, DType::bf16, {24, 6}}, 0, {12, 12}), map);
  const std::string ptext = plan_to_json(plan);
  std::string bad = ptext;
  const auto at = bad.find("\"target\":[0,");
  REQUIRE(at != std::string::npos);
  bad.replace(at, 12, "\"target\":[1,");
  CHECK_THROWS_WITH(plan_from_json(bad), Catch::Contains("digest"));
}
