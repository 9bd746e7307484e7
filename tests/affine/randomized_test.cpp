// Randomized differential suite: >= 1,000 random (target, source) layout pairs, 1-D to 4-D, sizes with
// primes, degrees 1..8 (3 -> 5 included), uneven and zero-width splits, replicas, ZeRO-1/2 and ZeRO-3
// storage alone and nested under TP, every replica policy, direct and staged execution with random
// budgets; each transfer is compared bitwise with the gather-then-scatter oracle (NaN-filled targets,
// sentinel padding). Negative controls: two source ranks' pieces swapped must be refused by the
// planner, or (when holders are fixed up so the map is self-consistent) caught by the oracle. Some
// maps get one rank's replicated pieces cut in two, so replicas are cut at different boundaries.
//
// Replay: TESSERA_AFFINE_SEED=<seed> [TESSERA_AFFINE_PAIRS=<n>] ./affine_tests "[randomized]"
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <random>

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

namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g_); }  // inclusive
  bool coin() { return uniform(0, 1) == 1; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(uniform(0, static_cast<int64_t>(v.size()) - 1))]; }
  std::mt19937_64& engine() { return g_; }

 private:
  std::mt19937_64 g_;
};

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

Dims random_shape(Rng& rng) {
  static const std::vector<int64_t> extents = {1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 16, 17};
  for (;;) {
    const int ndim = static_cast<int>(rng.uniform(1, 4));
    Dims shape;
    for (int k = 0; k < ndim; ++k) shape.push_back(rng.pick(extents));
    if (ndim == 1 && rng.coin()) shape[0] = rng.uniform(20, 97);
    if (shape.product() <= 1200) return shape;
  }
}

// `parts` sizes summing to `total`: even, or random cuts (zeros allowed).
std::vector<int64_t> random_sizes(int64_t total, int parts, Rng& rng) {
  if (rng.coin()) return even_split_sizes(total, parts);
  std::vector<int64_t> cuts = {0, total};
  for (int i = 1; i < parts; ++i) cuts.push_back(rng.uniform(0, total));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  for (int i = 0; i < parts; ++i) sizes.push_back(cuts[static_cast<size_t>(i + 1)] - cuts[static_cast<size_t>(i)]);
  return sizes;
}

int degree(Rng& rng) { return static_cast<int>(rng.uniform(1, 8)); }

TensorMap relabel(const TensorMap& map, int scale, int shift) {
  TensorMap out = map;
  out.ranks.clear();
  for (const auto& [rank, st] : map.ranks) {
    RankStorage s = st;
    for (auto& p : s.pieces)
      for (auto& h : p.holders) h = h * scale + shift;
    out.ranks[rank * scale + shift] = s;
  }
  return out;
}

// Cuts the replicated pieces of one rank in two along a random axis (same storage, same holders): the
// replicas of those boxes on other ranks are now cut at different boundaries.
void recut_one_rank(TensorMap& map, Rng& rng, std::string& desc) {
  auto it = std::next(map.ranks.begin(), static_cast<long>(rng.uniform(0, static_cast<int64_t>(map.ranks.size()) - 1)));
  std::vector<Piece> out;
  int cuts = 0;
  for (const Piece& p : it->second.pieces) {
    std::vector<int> axes;
    for (int k = 0; k < p.box.ndim(); ++k)
      if (p.box.shape[k] > 1) axes.push_back(k);
    if (p.holders.size() < 2 || axes.empty()) {
      out.push_back(p);
      continue;
    }
    const int k = rng.pick(axes);
    const int64_t at = rng.uniform(1, p.box.shape[k] - 1);
    Piece a = p, b = p;
    a.box.shape[k] = at;
    b.box.origin[k] += at;
    b.box.shape[k] -= at;
    b.offset = p.address_of(b.box.origin);
    out.push_back(a);
    out.push_back(b);
    ++cuts;
  }
  it->second.pieces = out;
  if (cuts) desc += " recut(rank " + std::to_string(it->first) + ", " + std::to_string(cuts) + " pieces)";
}

TensorMap random_tp_layout(const TensorInfo& info, Rng& rng, std::string& desc) {
  const int dim = static_cast<int>(rng.uniform(0, info.shape.size() - 1));
  const int64_t extent = info.shape[dim];
  const int d = degree(rng);
  switch (rng.uniform(0, 4)) {
    case 0:
      desc += "replicated(" + std::to_string(d) + ")";
      return replicated(info, std::min(d, 4));
    case 1: {
      desc += "split(dim " + std::to_string(dim) + ", " + std::to_string(d) + ")";
      return contiguous_split(info, dim, random_sizes(extent, d, rng));
    }
    case 2: {
      const int subs = static_cast<int>(rng.uniform(1, 3));
      std::vector<int64_t> sizes = random_sizes(extent, subs, rng);
      std::vector<std::vector<int64_t>> widths;
      for (int64_t s : sizes) widths.push_back(random_sizes(s, d, rng));
      desc += "sub_params(dim " + std::to_string(dim) + ", " + std::to_string(subs) + " x " + std::to_string(d) + ")";
      return sub_param_split(info, dim, sizes, widths);
    }
    case 3: {
      const int segs = static_cast<int>(rng.uniform(1, 3));
      std::vector<LayoutSegment> segments;
      for (int64_t s : random_sizes(extent, segs, rng)) {
        LayoutSegment seg{s, rng.coin(), {}};
        if (!seg.replicated) seg.widths = random_sizes(s, d, rng);
        segments.push_back(seg);
      }
      desc += "segmented(dim " + std::to_string(dim) + ", " + std::to_string(d) + ")";
      return segmented(info, dim, segments, d);
    }
    default: {
      std::vector<int64_t> divisors;
      for (int64_t b = 1; b <= extent; ++b)
        if (extent % b == 0) divisors.push_back(b);
      const int64_t block = rng.pick(divisors);
      std::vector<int64_t> ids(static_cast<size_t>(extent / block));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
      std::shuffle(ids.begin(), ids.end(), rng.engine());
      std::vector<std::vector<int64_t>> by_rank(static_cast<size_t>(d));
      for (int64_t id : ids) by_rank[static_cast<size_t>(rng.uniform(0, d - 1))].push_back(id);
      desc += "block_gather(dim " + std::to_string(dim) + ", block " + std::to_string(block) + ", " + std::to_string(d) + ")";
      return block_gather(info, dim, block, by_rank);
    }
  }
}

std::vector<TensorInfo> with_neighbours(const TensorInfo& info, Rng& rng, size_t& index) {
  std::vector<TensorInfo> group;
  for (int i = 0, n = static_cast<int>(rng.uniform(0, 2)); i < n; ++i) group.push_back({"before", info.dtype, {rng.uniform(1, 40)}});
  index = group.size();
  group.push_back(info);
  for (int i = 0, n = static_cast<int>(rng.uniform(0, 2)); i < n; ++i) group.push_back({"after", info.dtype, {rng.uniform(1, 40)}});
  return group;
}

TensorMap random_storage(const TensorInfo& info, Rng& rng, std::string& desc) {
  const int dp = degree(rng);
  size_t index = 0;
  switch (rng.uniform(0, 3)) {
    case 0:
      desc += "zero3(" + std::to_string(dp) + ")";
      return zero3_partition(info, dp);
    case 1: {
      auto group = with_neighbours(info, rng, index);
      desc += "zero3_flat(" + std::to_string(dp) + ")";
      return zero3_flat_group(group, dp)[index];
    }
    case 2: {
      auto group = with_neighbours(info, rng, index);
      const int64_t alignment = rng.uniform(1, 2);
      desc += "zero12_flat(" + std::to_string(dp) + ", align " + std::to_string(alignment) + ")";
      return zero12_flat_group(group, dp, alignment)[index];
    }
    default:
      desc += "zero2_params(" + std::to_string(std::min(dp, 4)) + ")";
      return replicated(info, std::min(dp, 4));
  }
}

TensorMap random_map(const TensorInfo& info, Rng& rng, std::string& desc) {
  TensorMap map;
  switch (rng.uniform(0, 2)) {
    case 0:
      map = random_tp_layout(info, rng, desc);
      break;
    case 1:
      map = random_storage(info, rng, desc);
      break;
    default: {  // TP layout x ZeRO storage of each shard
      desc += "nest[";
      const TensorMap layout = random_tp_layout(info, rng, desc);
      desc += " x ";
      std::string storage_desc;
      const TensorMap probe = random_storage(info, rng, storage_desc);  // chooses the storage kind
      desc += storage_desc + "]";
      const int dp = static_cast<int>(probe.ranks.size());
      const std::string kind = storage_desc.substr(0, storage_desc.find('('));
      std::map<int, TensorMap> storage;
      for (const auto& [t, st] : layout.ranks) {
        const TensorInfo shard{info.name, info.dtype, st.buffer_shape};
        if (kind == "zero3") storage[t] = zero3_partition(shard, dp);
        else if (kind == "zero3_flat") storage[t] = zero3_flat_group({{"x", info.dtype, {5}}, shard}, dp)[1];
        else if (kind == "zero12_flat") storage[t] = zero12_flat_group({{"x", info.dtype, {3}}, shard}, dp, 2)[1];
        else storage[t] = replicated(shard, dp);
      }
      map = nest(layout, storage, [dp](int t, int s) { return t * dp + s; });
    }
  }
  if (rng.uniform(0, 3) == 0) recut_one_rank(map, rng, desc);
  if (rng.uniform(0, 4) == 0) {  // non-contiguous rank ids
    const int scale = static_cast<int>(rng.uniform(2, 3)), shift = static_cast<int>(rng.uniform(0, 5));
    map = relabel(map, scale, shift);
    desc += " relabelled(x" + std::to_string(scale) + "+" + std::to_string(shift) + ")";
  }
  return map;
}

PlanOptions random_policy(const TensorMap& target, const TensorMap& source, Rng& rng) {
  PlanOptions options;
  switch (rng.uniform(0, 3)) {
    case 0:
      options.policy = ReplicaPolicy::lowest();
      break;
    case 1:
      options.policy = ReplicaPolicy::balanced();
      options.policy.balanced_split_bytes = rng.pick(std::vector<int64_t>{4, 64, 1024, 1 << 20});
      break;
    case 2: {
      Placement pl;
      const int processes = static_cast<int>(rng.uniform(1, 6));
      for (const auto& [r, st] : source.ranks) pl.source_process[r] = static_cast<int>(rng.uniform(0, processes - 1));
      for (const auto& [r, st] : target.ranks) pl.target_process[r] = static_cast<int>(rng.uniform(0, processes - 1));
      for (int p = 0; p < processes; ++p)
        if (rng.coin()) pl.process_node[p] = p / 2;
      options.policy = ReplicaPolicy::local(pl);
      break;
    }
    default: {
      const uint64_t salt = static_cast<uint64_t>(rng.uniform(0, 1000));
      options.policy = ReplicaPolicy::callback("hash", [salt](const ReplicaRequest& r) {
        const uint64_t h = salt * 31 + static_cast<uint64_t>(r.target_rank) * 7 + static_cast<uint64_t>(r.box.origin.product());
        return r.candidates[h % r.candidates.size()].source_rank;
      });
    }
  }
  return options;
}

}  // namespace

TEST_CASE("randomized: >= 1,000 layout pairs against the gather-then-scatter oracle", "[affine][randomized]") {
  const uint64_t seed = env_u64("TESSERA_AFFINE_SEED", 20261129);
  const uint64_t pairs = env_u64("TESSERA_AFFINE_PAIRS", 1200);
  std::cout << "affine randomized suite: seed " << seed << ", " << pairs
            << " pairs (replay with TESSERA_AFFINE_SEED=" << seed << ")\n";
  Rng rng(seed);
  int refused_controls = 0, caught_controls = 0, executed = 0;
  std::map<std::string, int> policies;
  for (uint64_t i = 0; i < pairs; ++i) {
    const TensorInfo info{"t" + std::to_string(i), DType::f32, random_shape(rng)};
    std::string target_desc, source_desc;
    const TensorMap target = random_map(info, rng, target_desc);
    const TensorMap source = random_map(info, rng, source_desc);
    const PlanOptions options = random_policy(target, source, rng);
    INFO("seed " << seed << " pair " << i << " shape " << to_string(info.shape) << "\n  target " << target_desc
                 << "\n  source " << source_desc << "\n  policy " << options.policy.name());
    REQUIRE_NOTHROW(validate_map(source));
    Plan plan;
    REQUIRE_NOTHROW(plan = affine::plan(target, source, options));
    const bool staged = rng.coin();
    const int64_t budget = rng.pick(std::vector<int64_t>{4, 8, 36, 100, 4096, int64_t{64} << 20});
    REQUIRE(check_transfer(target, source, plan, staged, budget) == "");
    ++executed;
    ++policies[options.policy.kind == ReplicaPolicy::Kind::callback ? "callback" : options.policy.name()];

    // Negative control every 8th pair: swap two source ranks' pieces.
    if (i % 8 == 0 && source.ranks.size() >= 2) {
      auto a = source.ranks.begin();
      auto b = std::next(a, static_cast<long>(rng.uniform(1, static_cast<int64_t>(source.ranks.size()) - 1)));
      // Skip no-op swaps: both ranks hold no elements, or the same elements at the same addresses.
      auto held = [](const RankStorage& st) {
        int64_t n = 0;
        for (const auto& p : st.pieces) n += p.box.volume();
        return n;
      };
      const RankBuffers stored = make_source_buffers(source);
      if (held(a->second) == 0 && held(b->second) == 0) continue;
      if (stored.at(a->first).words == stored.at(b->first).words) continue;
      TensorMap swapped = source;
      std::swap(swapped.ranks[a->first].pieces, swapped.ranks[b->first].pieces);
      CHECK_THROWS_AS(affine::plan(target, swapped, options), tessera::MapError);
      ++refused_controls;
      // Holders fixed up: self-consistent but wrong about where the data is -> the oracle must notice.
      assign_holders_by_box(swapped);
      Plan wrong;
      try {
        wrong = affine::plan(target, swapped, options);
      } catch (const tessera::MapError&) {
        ++caught_controls;  // e.g. a piece now lies outside the smaller buffer
        continue;
      }
      RankBuffers sources = make_source_buffers(source);  // the data really lives where `source` says
      RankBuffers targets = make_target_buffers(target);
      const RankBuffers expected = scatter(target, gather(source, sources));
      execute_local({bind_buffers(wrong, sources, targets)});
      // The control must fail whenever the wrong plan reads one of the two ranks and they share no
      // (address, element) pair: then every such read returns another element or a hole.
      const PaddedBuffer& buf_a = sources.at(a->first);
      const PaddedBuffer& buf_b = sources.at(b->first);
      bool shared = false;
      for (int64_t k = 0; k < std::min(buf_a.elements, buf_b.elements); ++k)
        shared = shared || (buf_a.data()[k] == buf_b.data()[k] && buf_a.data()[k] != 0x11111111u);
      const auto& load = wrong.statistics.bytes_per_source_rank;
      if (shared || (!load.count(a->first) && !load.count(b->first))) continue;
      CHECK(compare(targets, expected) != "");
      ++caught_controls;
    }
  }
  std::cout << "affine randomized suite: " << executed << " transfers exact; " << refused_controls
            << " swapped sources refused, " << caught_controls << " fixed-up swaps caught; policies";
  for (const auto& [name, n] : policies) std::cout << " " << name << "=" << n;
  std::cout << "\n";
  CHECK(executed >= 1000);
  CHECK(refused_controls > 50);
}
