// FlatGroupLayout against a brute-force element-by-element oracle.
#include <catch2/catch.hpp>

#include <random>

#include "core/error.h"
#include "core/zero/flat_group_layout.h"

using tessera::zero::make_flat_group_layout;

TEST_CASE("Worked example: 73 elements at dp 3", "[zero][layout]") {
  auto layout = make_flat_group_layout({"a", "b", "c", "d"}, {35, 13, 24, 1}, 3);
  CHECK(layout.numel == 73);
  CHECK(layout.padded_numel == 75);
  CHECK(layout.partition_numel == 25);
  auto f = layout.fragments(1);
  REQUIRE(f.size() == 3);
  CHECK((f[0].param_index == 0 && f[0].param_begin == 25 && f[0].flat_begin == 25 && f[0].length == 10));
  CHECK((f[1].param_index == 1 && f[1].param_begin == 0 && f[1].flat_begin == 35 && f[1].length == 13));
  CHECK((f[2].param_index == 2 && f[2].param_begin == 0 && f[2].flat_begin == 48 && f[2].length == 2));
  CHECK(layout.padding_in_partition(2) == 2);
  CHECK(layout.padding_in_partition(0) == 0);
}

TEST_CASE("Fragments cover every element exactly once (random layouts, brute force)", "[zero][layout]") {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t dp = 1 + rng() % 8, align = 1 + rng() % 4, n = rng() % 7;
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    for (int64_t i = 0; i < n; ++i) {
      names.push_back("p" + std::to_string(i));
      numels.push_back(rng() % 4 == 0 ? 0 : int64_t(rng() % 50));  // zero-sized parameters too
    }
    auto layout = make_flat_group_layout(names, numels, dp, align);
    INFO("trial " << trial << " dp " << dp << " align " << align);
    REQUIRE(layout.padded_numel % (dp * align) == 0);
    REQUIRE(layout.padded_numel >= layout.numel);
    REQUIRE(layout.padded_numel - layout.numel < dp * align);
    // owner[flat] = (param, element) from the fragments; compare with the concatenation.
    std::vector<std::pair<int64_t, int64_t>> owner(layout.padded_numel, {-1, -1});
    int64_t padding = 0;
    for (int64_t r = 0; r < dp; ++r) {
      for (const auto& frag : layout.fragments(r)) {
        for (int64_t k = 0; k < frag.length; ++k) {
          const int64_t flat = frag.flat_begin + k;
          REQUIRE(flat >= layout.partition_begin(r));
          REQUIRE(flat < layout.partition_begin(r) + layout.partition_numel);
          REQUIRE(owner[flat].first == -1);
          owner[flat] = {frag.param_index, frag.param_begin + k};
        }
      }
      padding += layout.padding_in_partition(r);
    }
    int64_t flat = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < numels[i]; ++e, ++flat) REQUIRE(owner[flat] == std::make_pair(i, e));
    for (; flat < layout.padded_numel; ++flat) REQUIRE(owner[flat].first == -1);
    CHECK(padding == layout.padded_numel - layout.numel);
  }
}

TEST_CASE("Layout refuses bad input", "[zero][layout]") {
  CHECK_THROWS_WITH(make_flat_group_layout({"a"}, {3}, 0), Catch::Contains("data-parallel size 0"));
  CHECK_THROWS_WITH(make_flat_group_layout({"a"}, {-3}, 2), Catch::Contains("'a'"));
  CHECK_THROWS_WITH(make_flat_group_layout({"a", "b"}, {3}, 2), Catch::Contains("2 names but 1 sizes"));
  auto layout = make_flat_group_layout({"a"}, {3}, 2);
  CHECK_THROWS_WITH(layout.fragments(2), Catch::Contains("rank 2"));
}
