#include <catch2/catch.hpp>

#include "core/affine/errors.h"
#include "core/affine/validate.h"
#include "core/affine/zero_storage.h"
#include "oracle.h"

using namespace tessera::affine;
using namespace tessera::affine::testing;

namespace {

// Independent model of a ZeRO-1/2 flat group: concatenate the tensors' values (tensor t's element i
// has marker (t + 1) * 100000 + i + 1), pad with 0 to a multiple of dp * alignment, cut equal partitions.
std::vector<std::vector<uint32_t>> flat_partitions(const std::vector<int64_t>& numels, int dp, int64_t alignment) {
  std::vector<uint32_t> flat;
  for (size_t t = 0; t < numels.size(); ++t)
    for (int64_t i = 0; i < numels[t]; ++i) flat.push_back(static_cast<uint32_t>((t + 1) * 100000 + i + 1));
  const int64_t unit = dp * alignment;
  while (static_cast<int64_t>(flat.size()) % unit != 0) flat.push_back(0);
  const size_t p = flat.size() / static_cast<size_t>(dp);
  std::vector<std::vector<uint32_t>> out;
  for (int r = 0; r < dp; ++r) out.emplace_back(flat.begin() + static_cast<long>(r * p), flat.begin() + static_cast<long>((r + 1) * p));
  return out;
}

// The same partitions assembled through the maps: each map writes its tensor's markers.
std::vector<std::vector<uint32_t>> via_maps(const std::vector<TensorMap>& maps, int dp) {
  std::vector<std::vector<uint32_t>> out;
  for (int r = 0; r < dp; ++r) out.emplace_back(static_cast<size_t>(maps.front().ranks.at(r).buffer_elements), 0u);
  for (size_t t = 0; t < maps.size(); ++t) {
    for (const auto& [rank, storage] : maps[t].ranks) {
      for (const auto& p : storage.pieces) {
        for_each_element(maps[t].shape, p, [&](int64_t linear, int64_t address) {
          out[static_cast<size_t>(rank)][static_cast<size_t>(address)] = static_cast<uint32_t>((t + 1) * 100000 + linear + 1);
        });
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("ZeRO-1/2 flat group: header example, straddling tensors, padding", "[affine][zero]") {
  const std::vector<TensorInfo> group = {{"a", DType::f32, {3, 5}}, {"b", DType::f32, {7}}};
  const auto maps = zero12_flat_group(group, 4);
  REQUIRE(maps.size() == 2);
  // 22 elements padded to 24, P = 6; a on rank 1: Box((1,1)+(1,4)) at 0 and Box((2,0)+(1,2)) at 4.
  CHECK(maps[0].ranks.at(1).buffer_elements == 6);
  REQUIRE(maps[0].ranks.at(1).pieces.size() == 2);
  CHECK(maps[0].ranks.at(1).pieces[0].box == Box({1, 1}, {1, 4}));
  CHECK(maps[0].ranks.at(1).pieces[1].box == Box({2, 0}, {1, 2}));
  CHECK(maps[0].ranks.at(1).pieces[1].offset == 4);
  CHECK(maps[0].ranks.at(3).pieces.empty());
  CHECK(maps[1].ranks.at(2).pieces[0].offset == 3);  // b straddles ranks 2 and 3
  for (const auto& m : maps) validate_map(m);
  CHECK(via_maps(maps, 4) == flat_partitions({15, 7}, 4, 1));
}

TEST_CASE("ZeRO-1/2 flat group equals the flat-buffer model for many groups", "[affine][zero]") {
  const std::vector<std::vector<Dims>> groups = {
      {{4, 6, 5}, {13}, {2, 2}, {1}}, {{17, 3}}, {{5}, {5}, {5}}, {{2, 3, 4, 5}, {7, 11}}, {{1000, 3}, {3}}};
  for (const auto& shapes : groups) {
    for (int dp : {1, 2, 3, 4, 8}) {
      for (int64_t alignment : {1, 2}) {
        std::vector<TensorInfo> infos;
        std::vector<int64_t> numels;
        for (size_t i = 0; i < shapes.size(); ++i) {
          infos.push_back({"t" + std::to_string(i), DType::f32, shapes[i]});
          numels.push_back(shapes[i].product());
        }
        const auto maps = zero12_flat_group(infos, dp, alignment);
        for (const auto& m : maps) {
          validate_map(m);
          for (const auto& [rank, storage] : m.ranks) CHECK(storage.pieces.size() <= static_cast<size_t>(2 * m.shape.size() - 1));
        }
        CHECK(via_maps(maps, dp) == flat_partitions(numels, dp, alignment));
      }
    }
  }
}

TEST_CASE("ZeRO-3 partitions: padding excluded, ranks past the end empty", "[affine][zero]") {
  // (5, 3) = 15 elements over 4 ranks: P = 4, rank 3 holds elements 12..14 (one padding word).
  const TensorMap map = zero3_partition({"w", DType::bf16, {5, 3}}, 4);
  validate_map(map);
  CHECK(map.ranks.at(3).buffer_elements == 4);
  CHECK(map.ranks.at(3).pieces.size() == 1);
  CHECK(map.ranks.at(3).pieces[0].box == Box({4, 0}, {1, 3}));
  // 3 elements over 8 ranks: ranks 3..7 hold nothing.
  const TensorMap tiny = zero3_partition({"b", DType::f32, {3}}, 8);
  validate_map(tiny);
  for (int r = 3; r < 8; ++r) CHECK(tiny.ranks.at(r).pieces.empty());
  // Flat fp32 sub-group: rank r's buffer concatenates P_i-element partitions (padding included).
  const auto maps = zero3_flat_group({{"a", DType::f32, {5, 3}}, {"b", DType::f32, {6}}}, 4);
  CHECK(maps[1].ranks.at(0).buffer_elements == 4 + 2);
  CHECK(maps[1].ranks.at(0).pieces[0].offset == 4);
  for (const auto& m : maps) validate_map(m);
  CHECK_THROWS_AS(zero3_partition({"w", DType::f32, {4}}, 0), InvalidMapError);
}
