// The ZeRO-3 sharding plan (core/zero/unit_layout.h) against oracles computed another way:
//   - ownership: an element-by-element count over every rank's fragments (each element once);
//   - addresses: an independent model (units by first appearance, segments padded to 2W, each
//     rank's partition = its pieces of the persistent segment then of the units in order) that
//     gives every element its (rank, partition offset); the fragments must agree;
//   - all-gather: each segment's W pieces, taken from rank buffers filled via the fragments, give a
//     gathered buffer in which every parameter is contiguous at its slot;
//   - maps: validate_map, and a transfer from the stage-3 maps (weights with the persistent copy,
//     partitions) into replicated targets (planner + local executor) reproduces every parameter;
//   - negative controls: a shifted fragment fails the oracles, a shifted map piece the transfer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <random>

#include "core/affine/builders.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/affine/validate.h"
#include "core/error.h"
#include "core/zero/sharding_plan.h"

using namespace tessera;
using namespace tessera::zero;

namespace {

using Fragments = std::vector<std::vector<std::vector<PartitionFragment>>>;  // [group][rank]

PlannedParameter param(std::string name, std::vector<int64_t> shape, std::string module, int64_t group = 0,
                       bool low = false) {
  PlannedParameter p{std::move(name), std::move(shape), group, low};
  p.module = std::move(module);
  return p;
}

// A Llama-like model: weights in parameter group 0 (decay), norms and biases in group 1 (no decay);
// with `autocast`, the layers' Linear parameters reduce in the lower precision.
std::vector<PlannedParameter> llama(int layers, int64_t h, int64_t kv, int64_t ff, int64_t vocab, bool autocast) {
  std::vector<PlannedParameter> ps;
  ps.push_back(param("model.embed_tokens.weight", {vocab, h}, "model.embed_tokens"));
  for (int l = 0; l < layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    auto linear = [&](const std::string& m, int64_t out, int64_t in, bool bias) {
      ps.push_back(param(pre + m + ".weight", {out, in}, pre + m, 0, autocast));
      if (bias) ps.push_back(param(pre + m + ".bias", {out}, pre + m, 1, autocast));
    };
    linear("self_attn.q_proj", h, h, true);
    linear("self_attn.k_proj", kv, h, true);
    linear("self_attn.v_proj", kv, h, true);
    linear("self_attn.o_proj", h, h, false);
    linear("mlp.gate_proj", ff, h, false);
    linear("mlp.up_proj", ff, h, false);
    linear("mlp.down_proj", h, ff, false);
    ps.push_back(param(pre + "input_layernorm.weight", {h}, pre + "input_layernorm", 1));
    ps.push_back(param(pre + "post_attention_layernorm.weight", {h}, pre + "post_attention_layernorm", 1));
  }
  ps.push_back(param("model.norm.weight", {h}, "model.norm", 1));
  ps.push_back(param("lm_head.weight", {vocab, h}, "lm_head"));
  return ps;
}

float marker(int64_t param, int64_t element) { return float(param * 100000 + element + 1); }

Fragments all_fragments(const ShardingPlan& plan) {
  Fragments out(plan.groups().size());
  for (size_t g = 0; g < out.size(); ++g)
    for (int r = 0; r < plan.world(); ++r) out[g].push_back(plan.fragments(int64_t(g), r));
  return out;
}

// "" when every element of every parameter lies in exactly one fragment inside its partition and
// no two fragments of a rank share a partition address; else what is wrong.
std::string ownership_errors(const ShardingPlan& plan, const Fragments& frags) {
  std::vector<std::vector<int>> count;
  for (const auto& p : plan.parameters()) count.emplace_back(size_t(p.numel()), 0);
  for (size_t g = 0; g < frags.size(); ++g) {
    const auto& group = plan.groups()[g];
    for (size_t r = 0; r < frags[g].size(); ++r) {
      std::vector<int> used(size_t(group.layout.partition_numel), 0);
      for (const auto& f : frags[g][r]) {
        const int64_t i = group.params.at(size_t(f.param_index));
        if (f.param_begin < 0 || f.param_begin + f.length > plan.parameters()[size_t(i)].numel())
          return "fragment outside parameter " + std::to_string(i);
        if (f.flat_begin < 0 || f.flat_begin + f.length > group.layout.partition_numel)
          return "fragment outside the partition of group " + std::to_string(g);
        for (int64_t e = 0; e < f.length; ++e) {
          ++count[size_t(i)][size_t(f.param_begin + e)];
          if (used[size_t(f.flat_begin + e)]++) return "rank " + std::to_string(r) + " address used twice";
        }
      }
    }
  }
  for (size_t i = 0; i < count.size(); ++i)
    for (size_t e = 0; e < count[i].size(); ++e)
      if (count[i][e] != 1)
        return "parameter " + std::to_string(i) + " element " + std::to_string(e) + " owned " +
               std::to_string(count[i][e]) + " times";
  return "";
}

// The independent model of the stage-3 layout: element e of parameter i -> (rank, partition offset).
struct Address {
  int rank;
  int64_t offset;
  friend bool operator==(const Address& a, const Address& b) { return a.rank == b.rank && a.offset == b.offset; }
};
std::map<std::pair<int64_t, int64_t>, Address> model_addresses(const std::vector<PlannedParameter>& ps, int W,
                                                               int64_t threshold, std::vector<int64_t>& partition) {
  // Flat groups in (parameter group, lower precision) order.
  std::map<std::pair<int64_t, bool>, int64_t> group_of;
  for (const auto& p : ps) group_of[{p.param_group, p.lower_precision}] = 0;
  int64_t next = 0;
  for (auto& [key, g] : group_of) g = next++;
  // Segments: per group, persistent first, then modules in first-appearance order.
  std::vector<std::string> modules;
  for (const auto& p : ps)
    if (!(p.persistent || p.numel() <= threshold) && std::find(modules.begin(), modules.end(), p.module) == modules.end())
      modules.push_back(p.module);
  std::map<std::pair<int64_t, bool>, Address> unused;
  std::map<std::pair<int64_t, int64_t>, Address> out;
  partition.assign(size_t(next), 0);
  for (int64_t g = 0; g < next; ++g) {
    for (int64_t m = -1; m < int64_t(modules.size()); ++m) {
      std::vector<int64_t> members;
      for (size_t i = 0; i < ps.size(); ++i) {
        const bool keep = ps[i].persistent || ps[i].numel() <= threshold;
        if (group_of[{ps[i].param_group, ps[i].lower_precision}] != g) continue;
        if (m < 0 ? keep : (!keep && ps[i].module == modules[size_t(m)])) members.push_back(int64_t(i));
      }
      if (members.empty()) continue;
      int64_t total = 0;
      for (int64_t i : members) total += ps[size_t(i)].numel();
      const int64_t piece = (total + 2 * W - 1) / (2 * W) * 2;
      int64_t at = 0;
      for (int64_t i : members)
        for (int64_t e = 0; e < ps[size_t(i)].numel(); ++e, ++at)
          out[{i, e}] = {int(at / piece), partition[size_t(g)] + at % piece};
      partition[size_t(g)] += piece;
    }
  }
  return out;
}

std::string address_errors(const ShardingPlan& plan, const Fragments& frags,
                           const std::map<std::pair<int64_t, int64_t>, Address>& model) {
  for (size_t g = 0; g < frags.size(); ++g)
    for (size_t r = 0; r < frags[g].size(); ++r)
      for (const auto& f : frags[g][r])
        for (int64_t e = 0; e < f.length; ++e) {
          const int64_t i = plan.groups()[g].params[size_t(f.param_index)];
          if (!(model.at({i, f.param_begin + e}) == Address{int(r), f.flat_begin + e}))
            return "parameter " + std::to_string(i) + " element " + std::to_string(f.param_begin + e) + " misplaced";
        }
  return "";
}

// Rank buffers of flat group g filled from the markers via the fragments (padding: -1).
std::vector<std::vector<float>> filled_partitions(const ShardingPlan& plan, int64_t g) {
  const auto& group = plan.groups()[size_t(g)];
  std::vector<std::vector<float>> out;
  for (int r = 0; r < plan.world(); ++r) {
    out.emplace_back(size_t(group.layout.partition_numel), -1.0f);
    for (const auto& f : plan.fragments(g, r))
      for (int64_t e = 0; e < f.length; ++e)
        out.back()[size_t(f.flat_begin + e)] = marker(group.params[size_t(f.param_index)], f.param_begin + e);
  }
  return out;
}

// The all-gather of one segment: rank r's piece lands at r * partition_numel.
std::vector<float> gather(const Stage3Segment& s, const std::vector<std::vector<float>>& partitions) {
  std::vector<float> out;
  for (const auto& part : partitions)
    out.insert(out.end(), part.begin() + s.partition_offset, part.begin() + s.partition_offset + s.layout.partition_numel);
  return out;
}

// Moves every map of `maps` from `sources` into two replicated targets; true when both reproduce
// every parameter exactly (targets start as NaN). Refusals propagate.
bool transfer_reproduces(const ShardingPlan& plan, int64_t g, const std::vector<affine::TensorMap>& maps,
                         std::vector<std::vector<float>>& sources) {
  const auto& group = plan.groups()[size_t(g)];
  std::vector<affine::Plan> plans;
  std::vector<std::vector<std::vector<float>>> targets;
  for (size_t k = 0; k < maps.size(); ++k) {
    const auto& p = plan.parameters()[size_t(group.params[k])];
    const auto target = affine::replicated({p.name, affine::DType::f32, affine::Dims(p.shape)}, 2);
    plans.push_back(affine::plan(target, maps[k]));
    targets.emplace_back(2, std::vector<float>(size_t(p.numel()), std::numeric_limits<float>::quiet_NaN()));
  }
  std::vector<affine::LocalTransfer> batch;
  for (size_t k = 0; k < maps.size(); ++k) {
    affine::LocalTransfer t;
    t.plan = &plans[k];
    for (size_t r = 0; r < sources.size(); ++r)
      t.source_buffers[int(r)] = {sources[r].data(), int64_t(sources[r].size()), affine::DType::f32};
    for (int r = 0; r < 2; ++r) t.target_buffers[r] = {targets[k][size_t(r)].data(), int64_t(targets[k][size_t(r)].size()), affine::DType::f32};
    batch.push_back(t);
  }
  affine::execute_local(batch);
  for (size_t k = 0; k < maps.size(); ++k)
    for (const auto& copy : targets[k])
      for (size_t e = 0; e < copy.size(); ++e)
        if (!(copy[e] == marker(group.params[k], int64_t(e)))) return false;
  return true;
}

// Every check of this file on one plan.
void check_stage3_plan(const ShardingPlan& plan) {
  const auto& ps = plan.parameters();
  const int W = plan.world();
  const int64_t threshold = plan.options().persistence_threshold;
  const auto frags = all_fragments(plan);
  CHECK(ownership_errors(plan, frags).empty());
  std::vector<int64_t> model_partition;
  const auto model = model_addresses(ps, W, threshold, model_partition);
  CHECK(address_errors(plan, frags, model).empty());
  REQUIRE(model_partition.size() == plan.groups().size());
  // Units: the modules of partitioned parameters in first-appearance order, with those parameters.
  std::vector<std::string> modules;
  for (size_t i = 0; i < ps.size(); ++i) {
    CHECK(plan.persistent(int64_t(i)) == (ps[i].persistent || ps[i].numel() <= threshold));
    if (!plan.persistent(int64_t(i)) && std::find(modules.begin(), modules.end(), ps[i].module) == modules.end())
      modules.push_back(ps[i].module);
  }
  REQUIRE(plan.units().size() == modules.size());
  for (size_t u = 0; u < modules.size(); ++u) {
    const auto& unit = plan.units()[u];
    CHECK(unit.module == modules[u]);
    std::vector<int64_t> expected, listed;
    for (size_t i = 0; i < ps.size(); ++i)
      if (!plan.persistent(int64_t(i)) && ps[i].module == modules[u]) expected.push_back(int64_t(i));
    CHECK(unit.params == expected);
    int64_t gathered = 0;
    for (int64_t s : unit.segments) {
      const auto& seg = plan.segments()[size_t(s)];
      CHECK(seg.unit == int64_t(u));
      CHECK(seg.gathered_offset == gathered);
      gathered += seg.layout.padded_numel;
      listed.insert(listed.end(), seg.params.begin(), seg.params.end());
    }
    CHECK(unit.gathered_numel == gathered);
    std::sort(listed.begin(), listed.end());
    CHECK(listed == expected);
  }
  for (size_t g = 0; g < plan.groups().size(); ++g) {
    const auto& group = plan.groups()[g];
    INFO("group " << g);
    CHECK(group.layout.partition_numel == model_partition[g]);
    // Segments tile the partition in order, the persistent one first; each padded to 2W.
    int64_t at = 0;
    for (size_t k = 0; k < group.segments.size(); ++k) {
      const auto& seg = plan.segments()[size_t(group.segments[k])];
      CHECK(seg.group == int64_t(g));
      CHECK(seg.partition_offset == at);
      CHECK(seg.layout.padded_numel % (2 * W) == 0);
      CHECK(seg.layout.padded_numel == seg.layout.partition_numel * W);
      CHECK((seg.persistent() == (k == 0 && plan.persistent(seg.params.front()))));
      for (size_t j = 0; j < seg.params.size(); ++j) {
        CHECK(plan.segment_place(seg.params[j]) == std::pair<int64_t, int64_t>{group.segments[k], int64_t(j)});
        CHECK(plan.place(seg.params[j]).first == int64_t(g));
      }
      at += seg.layout.partition_numel;
    }
    CHECK(at == group.layout.partition_numel);
    // Sub-groups tile the partition.
    int64_t next = 0;
    for (const auto& s : group.sub_groups) {
      CHECK(s.begin == next);
      next = s.end;
    }
    CHECK(next == group.layout.partition_numel);
    // The all-gather of each segment leaves every parameter contiguous at its slot.
    auto partitions = filled_partitions(plan, int64_t(g));
    std::vector<float> persistent_copy;
    for (int64_t s : group.segments) {
      const auto& seg = plan.segments()[size_t(s)];
      const auto gathered = gather(seg, partitions);
      REQUIRE(int64_t(gathered.size()) == seg.layout.padded_numel);
      bool contiguous = true;
      for (size_t j = 0; j < seg.params.size(); ++j)
        for (int64_t e = 0; e < seg.layout.params[j].numel; ++e)
          contiguous &= gathered[size_t(seg.layout.params[j].offset + e)] == marker(seg.params[j], e);
      CHECK(contiguous);
      if (seg.persistent()) {
        CHECK(seg.gathered_offset == group.layout.partition_numel);
        persistent_copy = gathered;
      }
    }
    CHECK(plan.weight_buffer_elements(int64_t(g)) == group.layout.partition_numel + int64_t(persistent_copy.size()));
    // Maps: valid, and a transfer into replicated targets reproduces every parameter.
    const auto weights = plan.weight_maps(int64_t(g), affine::DType::f32);
    const auto masters = plan.partition_maps(int64_t(g), affine::DType::f32);
    for (size_t k = 0; k < group.params.size(); ++k) {
      CHECK_NOTHROW(affine::validate_map(weights[k]));
      CHECK_NOTHROW(affine::validate_map(masters[k]));
      const auto& p = ps[size_t(group.params[k])];
      if (plan.persistent(group.params[k])) {  // whole on every rank, at its place in the persistent copy
        const auto& seg = plan.segments()[size_t(plan.segment_place(group.params[k]).first)];
        auto m = affine::replicated({p.name, affine::DType::f32, affine::Dims(p.shape)}, W);
        for (auto& [rank, storage] : m.ranks) {
          storage.buffer_elements = plan.weight_buffer_elements(int64_t(g)), storage.buffer_shape = affine::Dims();
          for (auto& piece : storage.pieces)
            piece.offset += seg.gathered_offset + seg.layout.params[size_t(plan.segment_place(group.params[k]).second)].offset;
          if (p.numel() == 0) storage.pieces.clear();  // stored_runs keeps no empty piece
        }
        CHECK(weights[k] == m);
      } else {  // weights, masters and optimizer states share the pieces
        for (int r = 0; r < W; ++r) CHECK(weights[k].ranks.at(r).pieces == masters[k].ranks.at(r).pieces);
      }
    }
    CHECK(transfer_reproduces(plan, int64_t(g), masters, partitions));
    auto weight_buffers = partitions;
    for (auto& b : weight_buffers) b.insert(b.end(), persistent_copy.begin(), persistent_copy.end());
    CHECK(transfer_reproduces(plan, int64_t(g), weights, weight_buffers));
  }
  // No buckets at stage 3: the reducer reduce-scatters per segment.
  CHECK(plan.buckets().buckets.empty());
  CHECK(plan.buckets().param_buckets.size() == ps.size());
  CHECK_FALSE(plan.partitioned_gradients());
}

ShardingPlanOptions stage3(int world, int64_t threshold = 0) {
  ShardingPlanOptions o;
  o.stage = 3, o.world = world, o.persistence_threshold = threshold, o.sub_group_elements = 7;
  return o;
}

}  // namespace

TEST_CASE("Stage 3 plan: the header example (unit_layout.h)", "[zero][plan][stage3]") {
  ShardingPlan plan({param("l1.weight", {3, 5}, "l1"), param("l1.bias", {5}, "l1", 1), param("norm.weight", {4}, "norm", 1),
                     param("l2.weight", {2, 3}, "l2")},
                    stage3(2, 4));
  REQUIRE(plan.units().size() == 2);
  CHECK(plan.units()[0].module == "l1");
  CHECK(plan.units()[0].params == std::vector<int64_t>{0, 1});
  CHECK(plan.units()[0].gathered_numel == 24);
  CHECK(plan.units()[1].module == "l2");
  CHECK(plan.persistent(2));
  const auto& g0 = plan.groups()[0];
  const auto& g1 = plan.groups()[1];
  CHECK(g0.layout.partition_numel == 12);
  CHECK(g1.layout.partition_numel == 6);
  CHECK(plan.weight_buffer_elements(1) == 10);
  const auto f = plan.fragments(0, 1);
  REQUIRE(f.size() == 2);
  CHECK((f[0].param_index == 0 && f[0].param_begin == 8 && f[0].flat_begin == 0 && f[0].length == 7));
  CHECK((f[1].param_index == 1 && f[1].param_begin == 4 && f[1].flat_begin == 8 && f[1].length == 2));
  const auto h = plan.fragments(1, 0);  // norm.weight[0, 2) at 0, l1.bias[0, 4) at 2
  REQUIRE(h.size() == 2);
  CHECK((h[0].param_index == 1 && h[0].flat_begin == 0 && h[0].length == 2));
  CHECK((h[1].param_index == 0 && h[1].flat_begin == 2 && h[1].length == 4));
  const auto w = plan.weight_maps(0, affine::DType::f32);
  const auto& l1 = w[0].ranks.at(1).pieces;
  REQUIRE(l1.size() == 2);
  CHECK(l1[0].box == affine::Box(affine::Dims({1, 3}), affine::Dims({1, 2})));
  CHECK((l1[1].box == affine::Box(affine::Dims({2, 0}), affine::Dims({1, 5})) && l1[1].offset == 2));
  CHECK(plan.weight_maps(1, affine::DType::f32)[1].ranks.at(1).pieces.at(0).offset == 6);  // norm whole at 6
  // The sharding plan header's example.
  ShardingPlan small({param("a", {3, 5}, "l1"), param("b", {7}, "l2")}, stage3(2));
  CHECK(small.groups()[0].layout.partition_numel == 12);
  const auto s = small.fragments(0, 1);
  REQUIRE(s.size() == 2);
  CHECK((s[0].param_begin == 8 && s[0].flat_begin == 0 && s[1].param_begin == 4 && s[1].flat_begin == 8));
  check_stage3_plan(plan);
  check_stage3_plan(small);
}

TEST_CASE("Stage 3 plan: a Llama-like model, W = 1..4, with and without persistence", "[zero][plan][stage3]") {
  const int64_t h = 8, kv = 4, ff = 12, vocab = 13;
  for (const bool autocast : {false, true}) {
    const auto ps = llama(2, h, kv, ff, vocab, autocast);
    for (int W = 1; W <= 4; ++W) {
      for (const int64_t threshold : {int64_t(0), h, kv * h}) {
        INFO("autocast " << autocast << " W " << W << " threshold " << threshold);
        ShardingPlan plan(ps, stage3(W, threshold));
        CHECK(plan.groups().size() == (autocast ? 4u : 2u));
        check_stage3_plan(plan);
        // No threshold: one unit per module. Threshold h: norms (and q biases) stay gathered, so
        // the norm modules are no units; kv*h: k/v projections vanish too.
        size_t expected_units = 2 + 2 * (threshold == 0 ? 9 : threshold == h ? 7 : 5) + (threshold == 0);
        CHECK(plan.units().size() == expected_units);
        CHECK(plan.units().front().module == "model.embed_tokens");
        CHECK(plan.units().back().module == "lm_head");
      }
    }
  }
}

TEST_CASE("Stage 3 plan: random models (interleaved modules, forced persistence, empty parameters)",
          "[zero][plan][stage3]") {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 120; ++trial) {
    const int groups = 1 + int(rng() % 2);
    std::vector<PlannedParameter> ps;
    const int n = groups + int(rng() % 7);
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> shape;
      for (int d = 0, nd = int(rng() % 4); d < nd; ++d) shape.push_back(int64_t(rng() % 6));
      auto p = param("p" + std::to_string(i), shape, rng() % 5 == 0 ? "" : "m" + std::to_string(rng() % 4),
                     i < groups ? i : int64_t(rng() % groups), rng() % 4 == 0);
      p.persistent = rng() % 6 == 0;
      ps.push_back(p);
    }
    const int W = 1 + int(rng() % 4);
    INFO("trial " << trial << " W " << W);
    check_stage3_plan(ShardingPlan(ps, stage3(W, int64_t(rng() % 12))));
  }
}

TEST_CASE("Stage 3 plan: negative controls fail the oracles", "[zero][plan][stage3]") {
  const auto ps = llama(1, 8, 4, 12, 13, false);
  ShardingPlan plan(ps, stage3(3, 8));
  auto frags = all_fragments(plan);
  std::vector<int64_t> partition;
  const auto model = model_addresses(ps, 3, 8, partition);
  REQUIRE(ownership_errors(plan, frags).empty());
  REQUIRE(address_errors(plan, frags, model).empty());
  auto wrong_element = frags;
  wrong_element[0][1][1].param_begin += 1;  // claims one element more, misses the first
  CHECK_FALSE(ownership_errors(plan, wrong_element).empty());
  auto wrong_offset = frags;
  wrong_offset[1][2][0].flat_begin += 2;  // same elements, wrong place in the partition
  CHECK_FALSE(address_errors(plan, wrong_offset, model).empty());
  // A map piece shifted by one element: the transfer no longer reproduces (or is refused).
  auto partitions = filled_partitions(plan, 0);
  auto maps = plan.partition_maps(0, affine::DType::f32);
  REQUIRE(transfer_reproduces(plan, 0, maps, partitions));
  maps[0].ranks.at(1).pieces.at(0).offset += 1;
  bool reproduced = true;
  try {
    reproduced = transfer_reproduces(plan, 0, maps, partitions);
  } catch (const Error&) {
    reproduced = false;
  }
  CHECK_FALSE(reproduced);
}

TEST_CASE("Stage 3 plan: modules, persistence and thresholds leave stages 0-2 unchanged", "[zero][plan][stage3]") {
  auto ps = llama(1, 8, 4, 12, 13, true);
  auto bare = ps;
  for (auto& p : bare) p.module.clear();
  ps[3].persistent = true;
  for (int64_t stage = 0; stage <= 2; ++stage) {
    for (int W : {1, 3}) {
      ShardingPlanOptions o;
      o.stage = stage, o.world = W, o.bucket_elements = 40, o.sub_group_elements = 30;
      ShardingPlan reference(bare, o);
      o.persistence_threshold = 100;
      ShardingPlan plan(ps, o);
      CHECK(plan.units().empty());
      CHECK(plan.segments().empty());
      CHECK_FALSE(plan.persistent(3));
      CHECK(plan.segment_place(3) == std::pair<int64_t, int64_t>{-1, -1});
      CHECK(plan.buckets().buckets.size() == reference.buckets().buckets.size());
      for (size_t g = 0; g < plan.groups().size(); ++g) {
        CHECK(plan.weight_maps(int64_t(g), affine::DType::bf16) == reference.weight_maps(int64_t(g), affine::DType::bf16));
        CHECK(plan.partition_maps(int64_t(g), affine::DType::f32) == reference.partition_maps(int64_t(g), affine::DType::f32));
        CHECK(plan.weight_buffer_elements(int64_t(g)) == plan.groups()[g].layout.padded_numel);
        // fragments() is the layout's, partition-relative.
        const auto& layout = plan.groups()[g].layout;
        for (int r = 0; r < W; ++r) {
          const auto got = plan.fragments(int64_t(g), r);
          const auto want = layout.fragments(plan.owned_partition(r));
          REQUIRE(got.size() == want.size());
          for (size_t k = 0; k < got.size(); ++k)
            CHECK((got[k].param_index == want[k].param_index && got[k].param_begin == want[k].param_begin &&
                   got[k].flat_begin == want[k].flat_begin - layout.partition_begin(plan.owned_partition(r))));
        }
      }
    }
  }
}

TEST_CASE("Stage 3 plan: refusals name what is wrong", "[zero][plan][stage3]") {
  auto o = stage3(2);
  o.persistence_threshold = -1;
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2}, "m")}, o), Catch::Contains("persistence threshold -1"));
  o = stage3(2);
  o.stage = 4;
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2}, "m")}, o), Catch::Contains("ZeRO stage 4"));
  CHECK_THROWS_WITH(ShardingPlan({param("a", {2}, "m")}, stage3(2)).fragments(0, 2), Catch::Contains("rank 2"));
}
