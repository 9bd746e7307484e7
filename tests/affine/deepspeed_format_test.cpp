#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/affine/builders.h"
#include "core/affine/deepspeed_format.h"
#include "core/affine/errors.h"
#include "core/affine/planner.h"
#include "core/affine/validate.h"
#include "core/affine/zero_storage.h"

using namespace tessera::affine;
namespace affine = tessera::affine;
using nlohmann::json;

TEST_CASE("DeepSpeed ParamAffineMap dicts: export layout, import, round trip", "[affine][deepspeed]") {
  const TensorMap rows = contiguous_split({"w", DType::f32, {8, 8}}, 0, {4, 4});
  const json j = json::parse(map_to_deepspeed_json(rows));
  CHECK(j["logical_shape"] == json({8, 8}));
  // Rank keys are strings; rank 1: shard (4,8), source offset 32 with the tensor's strides.
  CHECK(j["ranks"]["1"] == json::parse(R"({"shard_shape": [4, 8], "pieces": [{"shape": [4, 8],
        "source": [32, [8, 1]], "dest": [0, [8, 1]], "locations": [1]}]})"));
  CHECK(map_from_deepspeed_json(j.dump(), "w") == rows);
  // Flat ZeRO storage (1-D shard, N-D pieces) survives too.
  const TensorMap z3 = zero3_partition({"w", DType::f32, {5, 7}}, 3);
  const TensorMap back = map_from_deepspeed_json(map_to_deepspeed_json(z3), "w");
  validate_map(back);
  for (const auto& [rank, st] : z3.ranks) CHECK(back.ranks.at(rank).pieces == st.pieces);
  // A checkpoint document with escaped names.
  std::vector<TensorMap> maps = {rows, replicated({"model.norm.weight", DType::f32, {8}}, 2)};
  const auto read = maps_from_deepspeed_json(maps_to_deepspeed_json(maps));
  REQUIRE(read.size() == 2);
  CHECK(read[0].name == "model.norm.weight");
  CHECK(json::parse(maps_to_deepspeed_json(maps))["params"].contains("^model\\.norm\\.weight$"));
  CHECK(read_maps_any_format(j.dump()).size() == 1);
  CHECK(read_maps_any_format(maps_to_deepspeed_json(maps)).size() == 2);
}

TEST_CASE("DeepSpeed import refusals", "[affine][deepspeed]") {
  const std::string base = R"({"logical_shape": [4, 4], "ranks": {"0": {"shard_shape": [4, 4], "pieces": [
      {"shape": [4, 4], "source": [0, [4, 1]], "dest": [0, [4, 1]], "locations": [0]PLUS}]}}})";
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = base;
    if (from != "PLUS") t.replace(t.find("PLUS"), 4, "");
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  CHECK_NOTHROW(validate_map(map_from_deepspeed_json(with("PLUS", ""), "w")));
  CHECK_NOTHROW(map_from_deepspeed_json(with("PLUS", ", \"scale\": 1.0"), "w"));
  CHECK_THROWS_AS(map_from_deepspeed_json(with("PLUS", ", \"scale\": 0.25"), "w"), UnsupportedLayoutError);
  CHECK_THROWS_AS(map_from_deepspeed_json(with("[0, [4, 1]]", "[0, [1, 4]]"), "w"), UnsupportedLayoutError);
  CHECK_THROWS_WITH(map_from_deepspeed_json(with("[0, [4, 1]]", "[3, [4, 1]]"), "w"),
                    Catch::Contains("not a coordinate"));
  CHECK_THROWS_WITH(map_from_deepspeed_json(with("[0, [4, 1]], \"dest\"", "[0, [4, 1, 1]], \"dest\""), "w"),
                    Catch::Contains("stride vector length"));
  CHECK_THROWS_AS(map_from_deepspeed_json(with("\"0\":", "\"zero\":"), "w"), FormatError);
}

TEST_CASE("DeepSpeed TransferPlan dicts: export and import", "[affine][deepspeed]") {
  const Plan plan = affine::plan(contiguous_split({"w", DType::f32, {8, 8}}, 1, {2, 2, 2, 2}),
                                 contiguous_split({"w", DType::f32, {8, 8}}, 0, {4, 4}));
  const json j = json::parse(plan_to_deepspeed_json(plan));
  CHECK_FALSE(j.contains("logical_origin"));
  REQUIRE(j["segments"].size() == 8);
  CHECK(j["segments"][0] == json::parse(R"({"shape": [4, 2], "source": [0, 0, [8, 1]], "target": [0, 0, [2, 1]]})"));
  const Plan back = plan_from_deepspeed_json(j.dump(), "w");
  CHECK(back.segments == plan.segments);
  CHECK(back.statistics.moved_elements == 64);
}
