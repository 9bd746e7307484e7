#include <catch2/catch.hpp>

#include "core/affine/builders.h"
#include "core/affine/errors.h"
#include "core/affine/planner.h"
#include "oracle.h"

using namespace tessera::affine;
namespace affine = tessera::affine;
using namespace tessera::affine::testing;

namespace {

TensorMap bigcode(int degree) {
  return segmented({"c_attn", DType::f32, {48, 8}}, 0,
                   {LayoutSegment{32, false, even_split_sizes(32, degree)}, LayoutSegment{16, true, {}}}, degree);
}

PlanOptions with(ReplicaPolicy policy) {
  PlanOptions o;
  o.policy = std::move(policy);
  return o;
}

}  // namespace

TEST_CASE("callback policy: called once per replicated intersection, validated", "[affine][policy]") {
  int calls = 0;
  auto half = ReplicaPolicy::callback("target_rank/2", [&](const ReplicaRequest& r) {
    ++calls;
    CHECK(r.box == Box({32, 0}, {16, 8}));
    CHECK(r.candidates.size() == 2);
    CHECK(r.candidates[0].source_rank == 0);
    return r.target_rank / 2;
  });
  const Plan p = affine::plan(bigcode(4), bigcode(2), with(half));
  CHECK(calls == 4);
  CHECK(p.segments.size() == 6);
  CHECK(p.statistics.bytes_per_source_rank == std::map<int, int64_t>{{0, 384 * 4}, {1, 384 * 4}});
  CHECK(p.policy == "callback:target_rank/2");
  CHECK(check_transfer(bigcode(4), bigcode(2), p).empty());
  // A highest-holder selector still needs 7 segments.
  auto highest = ReplicaPolicy::callback("highest", [](const ReplicaRequest& r) { return r.candidates.back().source_rank; });
  CHECK(affine::plan(bigcode(4), bigcode(2), with(highest)).segments.size() == 7);
  for (int bad : {999, -1, 5}) {
    auto wrong = ReplicaPolicy::callback("bad", [bad](const ReplicaRequest&) { return bad; });
    CHECK_THROWS_AS(affine::plan(bigcode(4), bigcode(2), with(wrong)), ReplicaPolicyError);
  }
  CHECK_THROWS_AS(affine::plan(bigcode(4), bigcode(2), with(ReplicaPolicy::callback("none", nullptr))),
                  ReplicaPolicyError);
}

TEST_CASE("callback policy reads the chosen replica at its own address", "[affine][policy]") {
  // Two replicas of an (8,) tensor store its halves in swapped order.
  TensorMap src;
  src.name = "w";
  src.shape = {8};
  src.ranks[0].buffer_elements = 8;
  src.ranks[0].pieces = {Piece{Box({0}, {4}), 0, {1}, {0, 1}}, Piece{Box({4}, {4}), 4, {1}, {0, 1}}};
  src.ranks[1].buffer_elements = 8;
  src.ranks[1].pieces = {Piece{Box({0}, {4}), 4, {1}, {0, 1}}, Piece{Box({4}, {4}), 0, {1}, {0, 1}}};
  const TensorMap dst = replicated({"w", DType::f32, {8}}, 1);
  auto second = ReplicaPolicy::callback("one", [](const ReplicaRequest&) { return 1; });
  const Plan p = affine::plan(dst, src, with(second));
  REQUIRE(p.segments.size() == 2);
  CHECK(p.segments[0].source_rank == 1);
  CHECK(p.segments[0].source_offset == 4);
  CHECK(p.segments[0].target_offset == 0);
  CHECK(p.segments[1].source_offset == 0);
  CHECK(p.segments[1].target_offset == 4);
  CHECK(check_transfer(dst, src, p).empty());
}

TEST_CASE("balanced policy spreads replicated bytes, splitting big regions", "[affine][policy]") {
  // bigcode: 384/384 without splitting.
  const Plan b = affine::plan(bigcode(4), bigcode(2), with(ReplicaPolicy::balanced()));
  CHECK(b.statistics.bytes_per_source_rank == std::map<int, int64_t>{{0, 384 * 4}, {1, 384 * 4}});
  CHECK(check_transfer(bigcode(4), bigcode(2), b).empty());
  // One (64, 16) tensor replicated on 4 DP ranks read by one target: lowest reads all from rank 0;
  // balanced splits the region into 4 row blocks, one per holder.
  const TensorMap src = replicated({"w", DType::f32, {64, 16}}, 4);
  const TensorMap dst = replicated({"w", DType::f32, {64, 16}}, 1);
  CHECK(affine::plan(dst, src).statistics.bytes_per_source_rank == std::map<int, int64_t>{{0, 4096}});
  auto policy = ReplicaPolicy::balanced();
  policy.balanced_split_bytes = 1024;
  const Plan split = affine::plan(dst, src, with(policy));
  CHECK(split.statistics.bytes_per_source_rank ==
        std::map<int, int64_t>{{0, 1024}, {1, 1024}, {2, 1024}, {3, 1024}});
  CHECK(check_transfer(dst, src, split).empty());
}

TEST_CASE("local policy prefers the same process, then the same node", "[affine][policy]") {
  // Source: replicated on 4 ranks living on processes 0..3 (nodes 0,0,1,1). Target: 4 row shards on
  // processes 3, 2, 1, 0.
  const TensorMap src = replicated({"w", DType::f32, {8, 4}}, 4);
  const TensorMap dst = contiguous_split({"w", DType::f32, {8, 4}}, 0, {2, 2, 2, 2});
  Placement pl;
  pl.source_process = {{0, 0}, {1, 1}, {2, 2}, {3, 3}};
  pl.target_process = {{0, 3}, {1, 2}, {2, 1}, {3, 0}};
  pl.process_node = {{0, 0}, {1, 0}, {2, 1}, {3, 1}};
  const Plan p = affine::plan(dst, src, with(ReplicaPolicy::local(pl)));
  for (const auto& s : p.segments) CHECK(s.source_rank == 3 - s.target_rank);
  CHECK(check_transfer(dst, src, p).empty());
  // Same node only: target process 4 on node 1 reads from ranks 2 or 3 (least loaded, lowest first).
  Placement node_only = pl;
  node_only.target_process = {{0, 4}, {1, 4}, {2, 4}, {3, 4}};
  node_only.process_node[4] = 1;
  const Plan q = affine::plan(dst, src, with(ReplicaPolicy::local(node_only)));
  for (const auto& s : q.segments) CHECK((s.source_rank == 2 || s.source_rank == 3));
  CHECK(q.statistics.bytes_per_source_rank == std::map<int, int64_t>{{2, 64}, {3, 64}});
  // Missing placement is an error, not a silent fallback.
  Placement missing = pl;
  missing.source_process.erase(2);
  CHECK_THROWS_AS(affine::plan(dst, src, with(ReplicaPolicy::local(missing))), ReplicaPolicyError);
  CHECK_THROWS_AS(parse_replica_policy("nearest"), ReplicaPolicyError);
  CHECK(parse_replica_policy("balanced").kind == ReplicaPolicy::Kind::balanced);
  CHECK_THROWS_AS(parse_replica_policy("local"), ReplicaPolicyError);  // needs its tables
}

TEST_CASE("ReplicaPolicyKind: one default, names, and the policy of a kind", "[affine][policy]") {
  CHECK(ReplicaPolicy{}.kind == kDefaultReplicaPolicy);
  CHECK(kDefaultReplicaPolicy == ReplicaPolicyKind::lowest);
  for (const auto& [kind, name] : kReplicaPolicyNames) {
    CHECK(std::string(name_of(kind)) == name);
    CHECK(replica_policy_kind(name) == kind);
  }
  CHECK(std::string(name_of(ReplicaPolicyKind::callback)) == "callback");
  CHECK_THROWS_WITH(replica_policy_kind("callback"), Catch::Contains("expected one of lowest, local, balanced"));
  CHECK_THROWS_AS(replica_policy_kind("Lowest"), ReplicaPolicyError);  // exact spelling
  CHECK(ReplicaPolicy::of(ReplicaPolicyKind::lowest).name() == "lowest");
  CHECK(ReplicaPolicy::of(ReplicaPolicyKind::balanced).name() == ReplicaPolicy::balanced().name());
  Placement pl;
  pl.source_process = {{0, 0}};
  const auto local = ReplicaPolicy::of(ReplicaPolicyKind::local, pl);
  CHECK(local.kind == ReplicaPolicyKind::local);
  CHECK(local.placement.source_process == pl.source_process);
  CHECK_THROWS_AS(ReplicaPolicy::of(ReplicaPolicyKind::callback), ReplicaPolicyError);
}

TEST_CASE("plan_batch: balanced spreads the bytes of the whole batch", "[affine][policy]") {
  // Four small replicated tensors (below the split size): each is read whole from one holder, and
  // the batch spreads them over the 4 holders.
  std::vector<TensorMap> srcs, dsts;
  for (int i = 0; i < 4; ++i) {
    srcs.push_back(replicated({"t" + std::to_string(i), DType::f32, {16}}, 4));
    dsts.push_back(replicated({"t" + std::to_string(i), DType::f32, {16}}, 1));
  }
  std::vector<PlanRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back({&dsts[static_cast<size_t>(i)], &srcs[static_cast<size_t>(i)]});
  const auto plans = plan_batch(requests, with(ReplicaPolicy::balanced()));
  std::map<int, int64_t> load;
  for (const auto& p : plans)
    for (const auto& [r, b] : p.statistics.bytes_per_source_rank) load[r] += b;
  CHECK(load == std::map<int, int64_t>{{0, 64}, {1, 64}, {2, 64}, {3, 64}});
}
