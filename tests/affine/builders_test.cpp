#include <catch2/catch.hpp>

#include "core/affine/builders.h"
#include "core/affine/errors.h"
#include "core/affine/validate.h"
#include "oracle.h"

using namespace tessera::affine;
using namespace tessera::affine::testing;

namespace {

// Values a map puts in each rank's buffer (element i of the tensor has value i + 1; holes 0).
std::map<int, std::vector<uint32_t>> stored(const TensorMap& map) {
  std::map<int, std::vector<uint32_t>> out;
  for (auto& [rank, b] : make_source_buffers(map, 0)) out[rank] = std::vector<uint32_t>(b.data(), b.data() + b.elements);
  return out;
}

// Marker partition written independently of the builders: rank r's shard of a 2-D (rows, cols) tensor
// concatenates, along `dim`, the index ranges [begin, end) of `ranges[r]`, row-major.
std::vector<uint32_t> marker_shard(int64_t rows, int64_t cols, int dim, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<uint32_t> out;
  if (dim == 0) {
    for (auto [b, e] : ranges)
      for (int64_t i = b; i < e; ++i)
        for (int64_t j = 0; j < cols; ++j) out.push_back(static_cast<uint32_t>(i * cols + j + 1));
  } else {
    for (int64_t i = 0; i < rows; ++i)
      for (auto [b, e] : ranges)
        for (int64_t j = b; j < e; ++j) out.push_back(static_cast<uint32_t>(i * cols + j + 1));
  }
  return out;
}

}  // namespace

TEST_CASE("replicated: every rank holds the whole tensor, holders are all ranks", "[affine][builders]") {
  const TensorMap map = replicated({"norm", DType::bf16, {5, 6}}, 3);
  validate_map(map);
  for (const auto& [rank, storage] : map.ranks) {
    REQUIRE(storage.pieces.size() == 1);
    CHECK(storage.pieces[0].holders == std::vector<int>{0, 1, 2});
    CHECK(storage.buffer_shape == Dims({5, 6}));
  }
  for (const auto& [rank, values] : stored(map)) CHECK(values == marker_shard(5, 6, 0, {{0, 5}}));
}

TEST_CASE("contiguous_split: even, uneven [3,3,2,2] and zero-width, rows and columns", "[affine][builders]") {
  CHECK(even_split_sizes(10, 4) == std::vector<int64_t>{3, 3, 2, 2});
  for (int dim : {0, 1}) {
    const int64_t rows = dim == 0 ? 10 : 4, cols = dim == 0 ? 4 : 10;
    for (const auto& sizes : {std::vector<int64_t>{3, 3, 2, 2}, std::vector<int64_t>{0, 5, 0, 5},
                              std::vector<int64_t>{10}, std::vector<int64_t>{5, 5}}) {
      const TensorMap map = contiguous_split({"w", DType::f32, {rows, cols}}, dim, sizes);
      validate_map(map);
      auto values = stored(map);
      int64_t at = 0;
      for (size_t r = 0; r < sizes.size(); ++r) {
        INFO("dim " << dim << " rank " << r);
        CHECK(values[static_cast<int>(r)] == marker_shard(rows, cols, dim, {{at, at + sizes[r]}}));
        at += sizes[r];
      }
    }
  }
  // Column split of (8, 8) on 4 ranks: strides (2,1) of the (8,2) shard.
  const TensorMap col = contiguous_split({"w", DType::f32, {8, 8}}, 1, even_split_sizes(8, 4));
  CHECK(col.ranks.at(3).pieces[0].box == Box({0, 6}, {8, 2}));
  CHECK(col.ranks.at(3).pieces[0].strides == Dims({2, 1}));
  CHECK_THROWS_WITH(contiguous_split({"w", DType::f32, {8, 8}}, 0, {4, 3}), Catch::Contains("do not account"));
  CHECK_THROWS_AS(contiguous_split({"w", DType::f32, {8, 8}}, 2, {8}), InvalidMapError);
}

TEST_CASE("sub_param_split: fused QKV with unequal sizes and uneven widths", "[affine][builders]") {
  // Q 8 rows, K 2, V 2 on 2 ranks (header example): rank 1 = q[4:8], k[1:2], v[1:2].
  const TensorMap qkv = sub_param_split_even({"qkv", DType::f32, {12, 8}}, 0, {8, 2, 2}, 2);
  validate_map(qkv);
  const auto& r1 = qkv.ranks.at(1).pieces;
  REQUIRE(r1.size() == 3);
  CHECK(r1[0].box == Box({4, 0}, {4, 8}));
  CHECK(r1[1].box == Box({9, 0}, {1, 8}));
  CHECK(r1[1].offset == 32);
  CHECK(r1[2].box == Box({11, 0}, {1, 8}));
  CHECK(r1[2].offset == 40);
  CHECK(stored(qkv)[1] == marker_shard(12, 8, 0, {{4, 8}, {9, 10}, {11, 12}}));
  // DeepSpeed parity case: sub-parameters 7, 5, 3 with widths [[3,2,2],[2,2,1],[1,1,1]] on 3 ranks,
  // rows and columns.
  const std::vector<std::vector<int64_t>> widths = {{3, 2, 2}, {2, 2, 1}, {1, 1, 1}};
  for (int dim : {0, 1}) {
    const int64_t rows = dim == 0 ? 15 : 4, cols = dim == 0 ? 4 : 15;
    const TensorMap map = sub_param_split({"fused", DType::f32, {rows, cols}}, dim, {7, 5, 3}, widths);
    validate_map(map);
    auto values = stored(map);
    // rank r: [prefix(w0,r), +w0[r]) of [0,7), then the same in [7,12), then [12,15)
    const std::vector<std::vector<std::pair<int64_t, int64_t>>> expect = {
        {{0, 3}, {7, 9}, {12, 13}}, {{3, 5}, {9, 11}, {13, 14}}, {{5, 7}, {11, 12}, {14, 15}}};
    for (int r = 0; r < 3; ++r) CHECK(values[r] == marker_shard(rows, cols, dim, expect[static_cast<size_t>(r)]));
  }
  // gate/up (two equal halves) on 4 ranks: 2 pieces per rank.
  const TensorMap gate_up = sub_param_split_even({"gate_up", DType::bf16, {16, 4}}, 0, {8, 8}, 4);
  CHECK(gate_up.ranks.at(2).pieces.size() == 2);
  CHECK(stored(gate_up)[2] == marker_shard(16, 4, 0, {{4, 6}, {12, 14}}));
  CHECK_THROWS_WITH(sub_param_split({"x", DType::f32, {6, 2}}, 0, {3, 3}, {{2, 2}, {1, 2}}),
                    Catch::Contains("do not account"));
}

TEST_CASE("segmented: bigcode query rows split, KV rows replicated (48x8, TP4)", "[affine][builders]") {
  const TensorMap map = segmented({"c_attn", DType::f32, {48, 8}}, 0,
                                  {LayoutSegment{32, false, {8, 8, 8, 8}}, LayoutSegment{16, true, {}}}, 4);
  validate_map(map);
  const auto& last = map.ranks.at(3).pieces;
  REQUIRE(last.size() == 2);
  CHECK(last[0].holders.size() == 1);
  CHECK(last[1].holders == std::vector<int>{0, 1, 2, 3});  // the KV block is held by every rank
  CHECK(stored(map)[3] == marker_shard(48, 8, 0, {{24, 32}, {32, 48}}));
  // Uneven head-aligned widths and a refusal of widths that do not add up.
  const TensorMap uneven = segmented({"c_attn", DType::f32, {40, 8}}, 0,
                                     {LayoutSegment{24, false, {8, 8, 4, 4}}, LayoutSegment{16, true, {}}}, 4);
  CHECK(stored(uneven)[2] == marker_shard(40, 8, 0, {{16, 20}, {24, 40}}));
  CHECK_THROWS_WITH(segmented({"c", DType::f32, {48, 8}}, 0,
                              {LayoutSegment{32, false, {8, 8, 8, 6}}, LayoutSegment{16, true, {}}}, 4),
                    Catch::Contains("do not account"));
}

TEST_CASE("block_gather: lists of equal blocks per rank, consecutive ids merged", "[affine][builders]") {
  // Yuan-like value rows: 8 heads of 4 rows, rank 0 heads {0,1,4,5}, rank 1 heads {2,3,6,7}.
  const TensorMap rows = block_gather({"v", DType::f32, {32, 8}}, 0, 4, {{0, 1, 4, 5}, {2, 3, 6, 7}});
  validate_map(rows);
  CHECK(rows.ranks.at(0).pieces.size() == 2);
  CHECK(stored(rows)[1] == marker_shard(32, 8, 0, {{8, 16}, {24, 32}}));
  // o_proj columns, permuted order (CodeGen-like): rank 0 holds blocks 3, 0.
  const TensorMap cols = block_gather({"o", DType::f32, {8, 32}}, 1, 8, {{3, 0}, {1, 2}});
  validate_map(cols);
  CHECK(stored(cols)[0] == marker_shard(8, 32, 1, {{24, 32}, {0, 8}}));
  CHECK(stored(cols)[1] == marker_shard(8, 32, 1, {{8, 24}}));
  CHECK_THROWS_AS(block_gather({"o", DType::f32, {8, 30}}, 1, 8, {{0}}), InvalidMapError);
  // A block on two ranks is a replica; named twice on one rank it is refused by validation.
  CHECK_THROWS_AS(validate_map(block_gather({"o", DType::f32, {8, 16}}, 1, 8, {{0, 0}, {1}})), InvalidMapError);
}
