#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <functional>

#include "core/affine/builders.h"
#include "core/affine/errors.h"
#include "core/affine/planner.h"
#include "core/affine/validate.h"
#include "oracle.h"

using namespace tessera::affine;
namespace affine = tessera::affine;
using namespace tessera::affine::testing;

namespace {

TensorMap rows(int64_t r, int64_t c, int degree) {
  return contiguous_split({"w", DType::f32, {r, c}}, 0, even_split_sizes(r, degree));
}
TensorMap cols(int64_t r, int64_t c, int degree) {
  return contiguous_split({"w", DType::f32, {r, c}}, 1, even_split_sizes(c, degree));
}
TensorMap bigcode(int degree) {
  std::vector<int64_t> widths = even_split_sizes(32, degree);
  return segmented({"c_attn", DType::f32, {48, 8}}, 0, {LayoutSegment{32, false, widths}, LayoutSegment{16, true, {}}},
                   degree);
}

}  // namespace

TEST_CASE("plan: hand-derived addresses, (8,8) rows on TP2 -> columns on TP4", "[affine][planner]") {
  const Plan plan = affine::plan(cols(8, 8, 4), rows(8, 8, 2));
  // 8 segments of (4,2): target rank a gets columns 2a..2a+1; from source rank b rows 4b..4b+3:
  // source offset 2a, strides (8,1); target offset 8b, strides (2,1).
  REQUIRE(plan.segments.size() == 8);
  for (const Segment& s : plan.segments) {
    const int a = s.target_rank, b = s.source_rank;
    CHECK(s.shape == Dims({4, 2}));
    CHECK(s.source_offset == 2 * a);
    CHECK(s.source_strides == Dims({8, 1}));
    CHECK(s.target_offset == 8 * b);
    CHECK(s.target_strides == Dims({2, 1}));
  }
  CHECK(plan.statistics.moved_elements == 64);
  CHECK(plan.statistics.bytes_per_source_rank == std::map<int, int64_t>{{0, 128}, {1, 128}});
  CHECK(plan.statistics.bytes_per_pair.at({1, 3}) == 32);
  CHECK(check_transfer(cols(8, 8, 4), rows(8, 8, 2), plan).empty());
}

TEST_CASE("plan: bigcode 2 -> 4 folds physically: 7 segments, 640/128 under lowest", "[affine][planner]") {
  const Plan plan = affine::plan(bigcode(4), bigcode(2));
  CHECK(plan.statistics.moved_elements == 768);  // 4 x (8 query rows + 16 KV rows) x 8
  CHECK(plan.segments.size() == 7);
  CHECK(plan.statistics.bytes_per_source_rank.at(0) == 640 * 4);
  CHECK(plan.statistics.bytes_per_source_rank.at(1) == 128 * 4);
  // Source rank 0 stores q[8:16] then KV at offsets 64..191; target rank 1 stores q[8:16] then KV:
  // one merged dense copy of 24 rows = 192 elements.
  const auto merged = std::find_if(plan.segments.begin(), plan.segments.end(), [](const Segment& s) {
    return s.source_rank == 0 && s.target_rank == 1;
  });
  REQUIRE(merged != plan.segments.end());
  CHECK(merged->source_offset == 64);
  CHECK(merged->target_offset == 0);
  CHECK(merged->shape == Dims({192}));
  CHECK(check_transfer(bigcode(4), bigcode(2), plan).empty());
}

TEST_CASE("plan: identity, 0-d, 1-D bias, non-contiguous rank ids, replicated targets", "[affine][planner]") {
  const Plan identity = affine::plan(rows(6, 4, 2), rows(6, 4, 2));
  CHECK(identity.statistics.moved_elements == 24);
  for (const auto& s : identity.segments) CHECK(s.source_rank == s.target_rank);
  CHECK(check_transfer(rows(6, 4, 2), rows(6, 4, 2), identity).empty());

  const TensorMap scalar_src = replicated({"s", DType::f32, Dims()}, 3);
  const TensorMap scalar_dst = replicated({"s", DType::f32, Dims()}, 2);
  const Plan scalar = affine::plan(scalar_dst, scalar_src);
  CHECK(scalar.segments.size() == 2);
  CHECK(check_transfer(scalar_dst, scalar_src, scalar).empty());

  TensorMap odd = rows(8, 8, 2);
  odd.ranks[9] = odd.ranks[1];
  odd.ranks[3] = odd.ranks[0];
  odd.ranks.erase(0);
  odd.ranks.erase(1);
  odd.ranks[9].pieces[0].holders = {9};
  odd.ranks[3].pieces[0].holders = {3};
  const TensorMap one = replicated({"w", DType::f32, {8, 8}}, 1);
  const Plan from_odd = affine::plan(one, odd);
  CHECK(from_odd.statistics.moved_elements == 64);
  CHECK(check_transfer(one, odd, from_odd).empty());

  // A replicated target: every replica is written.
  const TensorMap rep = replicated({"w", DType::f32, {8, 8}}, 3);
  const Plan to_rep = affine::plan(rep, rows(8, 8, 2));
  CHECK(to_rep.statistics.moved_elements == 3 * 64);
  CHECK(check_transfer(rep, rows(8, 8, 2), to_rep).empty());
}

TEST_CASE("plan: target replicas stored in other pieces are fine when their holders say so", "[affine][planner]") {
  TensorMap target = rows(8, 4, 2);  // ranks 0, 1: rows 0..3 / 4..7
  target.ranks[0].pieces[0].holders = {0, 2};
  target.ranks[1].pieces[0].holders = {1, 2};
  // Rank 2 holds every row, in two pieces whose holders agree with ranks 0 and 1.
  target.ranks[2] = target.ranks[0];
  target.ranks[2].buffer_elements = 32;
  target.ranks[2].buffer_shape = {};
  target.ranks[2].pieces.push_back(target.ranks[1].pieces[0]);
  target.ranks[2].pieces[1].offset = 16;
  const Plan p = affine::plan(target, cols(8, 4, 2));
  CHECK(p.statistics.moved_elements == 64);
  CHECK(check_transfer(target, cols(8, 4, 2), p).empty());
}

TEST_CASE("plan: refuses every target `affine check` refuses (overlapping sole holders)", "[affine][planner]") {
  // Each piece claims to be the only holder of rows that another piece holds too.
  TensorMap target = rows(8, 4, 2);
  TensorMap whole = replicated({"w", DType::f32, {8, 4}}, 1);
  target.ranks[2] = whole.ranks[0];
  target.ranks[0].pieces[0].holders = {0};
  target.ranks[1].pieces[0].holders = {1};
  target.ranks[2].pieces[0].holders = {2};
  CHECK_THROWS_AS(validate_map(target), tessera::MapError);
  CHECK_THROWS_AS(affine::plan(target, cols(8, 4, 2)), HolderError);
  CHECK_THROWS_WITH(affine::plan(target, cols(8, 4, 2)), Catch::Contains("target") && Catch::Contains("two owners"));
  // Partly overlapping boxes, each its own only holder.
  TensorMap partial = rows(8, 4, 2);
  partial.ranks[1].pieces[0].box = Box({3, 0}, {5, 4});
  partial.ranks[1].buffer_elements = 20;
  CHECK_THROWS_AS(validate_map(partial), tessera::MapError);
  CHECK_THROWS_AS(affine::plan(partial, cols(8, 4, 2)), tessera::MapError);
}

TEST_CASE("plan: refusals name tensor, rank and box", "[affine][planner]") {
  const TensorMap good = rows(8, 8, 2);
  SECTION("different logical shapes, equal numel") {
    CHECK_THROWS_AS(affine::plan(replicated({"w", DType::f32, {64}}, 1), good), InvalidMapError);
  }
  SECTION("dtype mismatch") {
    TensorMap bf = good;
    bf.dtype = DType::bf16;
    CHECK_THROWS_AS(affine::plan(bf, good), InvalidMapError);
  }
  SECTION("half a tensor as source") {
    TensorMap half = good;
    half.ranks.erase(1);
    CHECK_THROWS_WITH(affine::plan(good, half), Catch::Contains("cover 32 of its 64"));
  }
  SECTION("target not covering") {
    TensorMap half = good;
    half.ranks.erase(1);
    CHECK_THROWS_AS(affine::plan(half, good), CoverageError);
    TensorMap none = good;
    none.ranks.clear();
    CHECK_THROWS_WITH(affine::plan(none, good), Catch::Contains("do not cover"));
  }
  SECTION("two owners for one region") {
    TensorMap two = good;
    two.ranks[1].pieces[0].box = Box({2, 0}, {4, 8});
    CHECK_THROWS_WITH(affine::plan(good, two), Catch::Contains("two owners") && Catch::Contains("source rank 1"));
  }
  SECTION("a named holder that does not hold the box") {
    TensorMap lie = good;
    lie.ranks[0].pieces[0].holders = {0, 1};
    CHECK_THROWS_WITH(affine::plan(good, lie), Catch::Contains("source rank 1 is named as a holder of Box((0,0)+(4,8))"));
    CHECK_THROWS_AS(affine::plan(good, lie), HolderError);
  }
  SECTION("replicas that disagree about their holders") {
    TensorMap rep = replicated({"w", DType::f32, {8, 8}}, 2);
    rep.ranks[0].pieces[0].holders = {0};
    CHECK_THROWS_AS(affine::plan(good, rep), HolderError);
  }
  SECTION("source replicas cut differently are cut to common boxes and planned exactly") {
    // Rank 0 holds the tensor as one piece, rank 1 the same elements as two row blocks (stored in
    // the other order). Every element is held by {0, 1}: homogeneous, just cut differently.
    TensorMap src = replicated({"w", DType::f32, {8, 8}}, 2);
    src.ranks[1].pieces = {Piece{Box({0, 0}, {4, 8}), 32, {8, 1}, {0, 1}}, Piece{Box({4, 0}, {4, 8}), 0, {8, 1}, {0, 1}}};
    src.ranks[1].buffer_shape = Dims();
    TensorMap disagree = src;
    disagree.ranks[1].pieces[1].holders = {1};
    CHECK_THROWS_AS(affine::plan(good, disagree), HolderError);
    TensorMap overclaim = src;
    overclaim.ranks[1].pieces.pop_back();  // rank 1 now holds only half of what rank 0 says it holds
    overclaim.ranks[1].pieces[0].holders = {0, 1};
    CHECK_THROWS_WITH(affine::plan(good, overclaim), Catch::Contains("does not hold it entirely"));
    for (const auto& policy : {ReplicaPolicy::lowest(), ReplicaPolicy::balanced()}) {
      PlanOptions o;
      o.policy = policy;
      const Plan p = affine::plan(cols(8, 8, 4), src, o);
      CHECK(p.statistics.source_regions == 2);  // rank 0's piece cut into the two row blocks
      CHECK(check_transfer(cols(8, 8, 4), src, p).empty());
    }
    auto second = ReplicaPolicy::callback("rank1", [](const ReplicaRequest&) { return 1; });
    PlanOptions o;
    o.policy = second;
    const Plan from1 = affine::plan(cols(8, 8, 4), src, o);
    CHECK(from1.statistics.bytes_per_source_rank == std::map<int, int64_t>{{1, 256}});
    CHECK(check_transfer(cols(8, 8, 4), src, from1).empty());
  }
  SECTION("two pieces of one rank on the same address") {
    TensorMap clash = replicated({"w", DType::f32, {4}}, 1);
    clash.ranks[0].pieces = {Piece{Box({0}, {2}), 0, {1}, {0}}, Piece{Box({2}, {2}), 0, {1}, {0}}};
    CHECK_THROWS_WITH(affine::plan(clash, replicated({"w", DType::f32, {4}}, 1)),
                      Catch::Contains("same storage addresses"));
    // Interleaved column pieces whose spans overlap but addresses do not are fine.
    TensorMap inter = replicated({"w", DType::f32, {4, 6}}, 1);
    inter.ranks[0].pieces = {Piece{Box({0, 0}, {4, 3}), 0, {6, 1}, {0}}, Piece{Box({0, 3}, {4, 3}), 3, {6, 1}, {0}}};
    CHECK(affine::plan(inter, replicated({"w", DType::f32, {4, 6}}, 1)).statistics.moved_elements == 24);
    inter.ranks[0].pieces[1].offset = 2;  // now column 2 of piece 0 and column 0 of piece 1 collide
    CHECK_THROWS_AS(affine::plan(inter, replicated({"w", DType::f32, {4, 6}}, 1)), StorageOverlapError);
  }
  SECTION("boxes outside the tensor or the buffer") {
    TensorMap out = good;
    out.ranks[1].pieces[0].box = Box({4, 1}, {4, 8});
    CHECK_THROWS_WITH(affine::plan(good, out), Catch::Contains("outside the tensor"));
    TensorMap past = good;
    past.ranks[1].pieces[0].offset = 1;
    CHECK_THROWS_WITH(affine::plan(good, past), Catch::Contains("outside the rank's buffer of 32"));
  }
  SECTION("strides that are not an axis-aligned layout") {
    TensorMap perm = good;
    perm.ranks[0].pieces[0].strides = {2, 1};  // rows 2 apart but 8 long: elements would share addresses
    CHECK_THROWS_AS(affine::plan(good, perm), UnsupportedLayoutError);
    TensorMap zero = good;
    zero.ranks[0].pieces[0].strides = {0, 1};
    CHECK_THROWS_WITH(affine::plan(good, zero), Catch::Contains("not an axis-aligned layout"));
    TensorMap wrong_len = good;
    wrong_len.ranks[0].pieces[0].strides = {8, 1, 1};
    CHECK_THROWS_WITH(affine::plan(good, wrong_len), Catch::Contains("stride vector"));
  }
  SECTION("a piece with the wrong number of axes, holders without the own rank") {
    TensorMap flat = good;
    flat.ranks[0].pieces[0].box = Box({0}, {32});
    flat.ranks[0].pieces[0].strides = {1};
    CHECK_THROWS_WITH(affine::plan(good, flat), Catch::Contains("spans 1 axes of a 2-axis tensor"));
    TensorMap other = good;
    other.ranks[0].pieces[0].holders = {1};
    CHECK_THROWS_AS(affine::plan(good, other), HolderError);
  }
  SECTION("budgets are safety limits with a clear error") {
    PlanOptions tight;
    tight.max_pieces = 1;
    CHECK_THROWS_WITH(affine::plan(good, good, tight), Catch::Contains("max_pieces"));
    PlanOptions few;
    few.max_segments = 1;
    CHECK_THROWS_AS(affine::plan(cols(8, 8, 4), good, few), BudgetExceededError);
  }
}

TEST_CASE("plan: a transposed (but non-overlapping) storage layout is exact", "[affine][planner]") {
  TensorMap transposed = replicated({"w", DType::f32, {3, 5}}, 1);
  transposed.ranks[0].pieces[0].strides = {1, 3};  // column-major storage
  const TensorMap src = rows(3, 5, 3);
  CHECK(check_transfer(transposed, src, affine::plan(transposed, src)).empty());
}

TEST_CASE("plan: cost does not depend on the number of elements", "[affine][planner]") {
  const Plan small = affine::plan(cols(10, 8, 4), rows(10, 8, 2));
  const Plan huge = affine::plan(cols(1000000000, 8, 4), rows(1000000000, 8, 2));
  CHECK(small.segments.size() == huge.segments.size());
  CHECK(small.statistics.candidate_segments == huge.statistics.candidate_segments);
  CHECK(huge.statistics.moved_elements == 8000000000);
}

TEST_CASE("plan: 1,024 one-row pieces on one rank plan quickly and merge", "[affine][planner]") {
  TensorMap many;
  many.name = "w";
  many.shape = {1024, 8};
  many.ranks[0].buffer_elements = 1024 * 8;
  for (int64_t r = 1023; r >= 0; --r) many.ranks[0].pieces.push_back(Piece{Box({r, 0}, {1, 8}), r * 8, {8, 1}, {0}});
  const TensorMap two = rows(1024, 8, 2);
  const Plan p = affine::plan(two, many);
  CHECK(p.statistics.source_pieces == 1024);
  CHECK(p.segments.size() == 2);  // merged back into one dense copy per target rank
  CHECK(check_transfer(two, many, p).empty());
}

TEST_CASE("plan: deterministic, independent of piece and rank order", "[affine][planner]") {
  TensorMap src = bigcode(4);
  TensorMap reversed = src;
  for (auto& [rank, st] : reversed.ranks) std::reverse(st.pieces.begin(), st.pieces.end());
  for (const auto& policy : {ReplicaPolicy::lowest(), ReplicaPolicy::balanced()}) {
    PlanOptions options;
    options.policy = policy;
    const Plan a = affine::plan(bigcode(2), src, options);
    const Plan b = affine::plan(bigcode(2), reversed, options);
    CHECK(a.segments == b.segments);
    CHECK(a.digest() == b.digest());
    CHECK(a.input_digest == b.input_digest);  // the canonical input form ignores piece order
    CHECK(affine::plan(bigcode(2), src, options) == a);
  }
  PlanOptions balanced;
  balanced.policy = ReplicaPolicy::balanced();
  CHECK(affine::plan(bigcode(2), src).input_digest != affine::plan(bigcode(2), src, balanced).input_digest);
}

TEST_CASE("plan: seven layouts x degree pairs {1,2,4}^2 against the oracle", "[affine][planner]") {
  // DeepSpeed's layouts: row_even 8x8, row_uneven 11x8, column 8x24, replicated 5x6, sub_params 12x8
  // (8,4), bigcode 48x8, yuan_gather 8x64 (8 column blocks of 8, rank r holds blocks r, r+d, ...).
  using Make = std::function<TensorMap(int)>;
  const std::vector<std::pair<std::string, Make>> layouts = {
      {"row_even", [](int d) { return rows(8, 8, d); }},
      {"row_uneven", [](int d) { return rows(11, 8, d); }},
      {"column", [](int d) { return cols(8, 24, d); }},
      {"replicated", [](int d) { return replicated({"w", DType::f32, {5, 6}}, d); }},
      {"sub_params", [](int d) { return sub_param_split_even({"w", DType::f32, {12, 8}}, 0, {8, 4}, d); }},
      {"bigcode", [](int d) { return bigcode(d); }},
      {"yuan_gather", [](int d) {
         std::vector<std::vector<int64_t>> ids(static_cast<size_t>(d));
         for (int64_t b = 0; b < 8; ++b) ids[static_cast<size_t>(b % d)].push_back(b);
         return block_gather({"w", DType::f32, {8, 64}}, 1, 8, ids);
       }}};
  for (const auto& [name, make] : layouts) {
    for (int from : {1, 2, 4}) {
      for (int to : {1, 2, 4}) {
        INFO(name << " " << from << " -> " << to);
        const TensorMap src = make(from), dst = make(to);
        for (const auto& policy : {ReplicaPolicy::lowest(), ReplicaPolicy::balanced()}) {
          PlanOptions o;
          o.policy = policy;
          const Plan p = affine::plan(dst, src, o);
          CHECK(check_transfer(dst, src, p).empty());
        }
      }
    }
  }
}

TEST_CASE("plan: empty pieces count against max_pieces; zero-size tensors plan to nothing", "[affine][planner]") {
  TensorMap src = rows(8, 8, 2);
  src.ranks[0].pieces.push_back(Piece{Box({8, 0}, {0, 8}), 32, {8, 1}, {0}});  // offset one past the end: legal
  src.ranks[0].pieces.push_back(Piece{Box({0, 0}, {0, 0}), 0, {8, 1}, {0}});
  CHECK(affine::plan(rows(8, 8, 2), src).statistics.moved_elements == 64);
  PlanOptions tight;
  tight.max_pieces = 3;
  CHECK_THROWS_AS(affine::plan(rows(8, 8, 2), src, tight), BudgetExceededError);
  const TensorMap empty_src = rows(0, 8, 2), empty_dst = cols(0, 8, 4);
  const Plan none = affine::plan(empty_dst, empty_src);
  CHECK(none.segments.empty());
  CHECK(check_transfer(empty_dst, empty_src, none).empty());
}
