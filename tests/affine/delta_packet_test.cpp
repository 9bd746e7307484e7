// Delta packets: last version + delta == a full transfer of the current version, bit for bit
// (oracle: the local executor moving the current buffers whole), for sparse and dense changes,
// strided reads and writes (rows -> columns), 2- and 4-byte elements; -0.0 vs +0.0 and NaN
// payloads count as changes (bits, not values); a source element sent to several targets (a
// replicated target) reaches each of them. Negative controls: a target that does not hold
// the last version ends up wrong; a truncated or lying packet is refused.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "core/affine/builders.h"
#include "core/affine/delta_packet.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/error.h"

using namespace tessera::affine;

namespace {

using Buffers = std::vector<std::vector<uint8_t>>;

Buffers full_transfer(const Plan& plan, Buffers& sources, int targets, int64_t target_elements) {
  const int64_t es = element_size(plan.dtype);
  Buffers out(targets, std::vector<uint8_t>(size_t(target_elements * es), 0xAB));
  LocalTransfer t;
  t.plan = &plan;
  for (size_t r = 0; r < sources.size(); ++r)
    t.source_buffers[int(r)] = {sources[r].data(), int64_t(sources[r].size()) / es, plan.dtype};
  for (int r = 0; r < targets; ++r) t.target_buffers[r] = {out[r].data(), target_elements, plan.dtype};
  execute_local({t});
  return out;
}

struct Case {
  DType dtype;
  double changed_fraction;
};

}  // namespace

TEST_CASE("delta packets: last + delta equals the full transfer bitwise", "[affine][delta]") {
  for (const Case c : {Case{DType::bf16, 0.02}, Case{DType::f32, 0.02}, Case{DType::bf16, 0.9}, Case{DType::f32, 0.0}}) {
    INFO("dtype " << dtype_name(c.dtype) << " changed " << c.changed_fraction);
    const int64_t rows = 64, cols = 48, es = element_size(c.dtype);
    const TensorInfo info{"w", c.dtype, {rows, cols}};
    const auto source = contiguous_split(info, 0, even_split_sizes(rows, 2));  // rows on 2
    const auto target = contiguous_split(info, 1, even_split_sizes(cols, 3));  // columns on 3
    const Plan plan = tessera::affine::plan(target, source);
    std::mt19937_64 rng(7);
    Buffers last(2, std::vector<uint8_t>(size_t(rows / 2 * cols * es)));
    for (auto& b : last)
      for (auto& x : b) x = uint8_t(rng());
    Buffers current = last;
    std::bernoulli_distribution change(c.changed_fraction);
    int64_t changed = 0;
    for (auto& b : current)
      for (size_t e = 0; e < b.size(); e += size_t(es))
        if (change(rng)) b[e + size_t(es) - 1] ^= 0x80, ++changed;  // a sign flip: -0.0 vs +0.0 too
    const int64_t target_elements = rows * (cols / 3);
    auto rollout = full_transfer(plan, last, 3, target_elements);  // holds the last version
    const auto expected = full_transfer(plan, current, 3, target_elements);
    CHECK((changed == 0) == (rollout == expected));
    auto last_copy = last;
    int64_t wire = 0, counted = 0;
    for (int s = 0; s < 2; ++s)
      for (int t = 0; t < 3; ++t) {
        std::vector<uint8_t> packet;
        DeltaPacketStats stats;
        append_delta(plan, s, t, {current[s].data(), int64_t(current[s].size()) / es, c.dtype},
                     {last_copy[s].data(), int64_t(last_copy[s].size()) / es, c.dtype}, packet, stats);
        CHECK(stats.bytes == int64_t(packet.size()));
        CHECK(stats.bytes <= stats.elements * es + 4 * 2);  // never more than full + headers
        wire += stats.bytes, counted += stats.changed;
        const size_t end = apply_delta(plan, s, t, packet.data(), packet.size(), 0,
                                       {rollout[t].data(), target_elements, c.dtype});
        CHECK(end == packet.size());
        if (!packet.empty() && packet.size() > 4) {  // a truncated packet is refused
          CHECK_THROWS_AS(apply_delta(plan, s, t, packet.data(), packet.size() - 1, 0,
                                      {rollout[t].data(), target_elements, c.dtype}),
                          tessera::TransportError);
        }
      }
    CHECK(counted == changed);
    CHECK(rollout == expected);  // bitwise
    CHECK(last_copy == last);     // only read
    if (c.changed_fraction < 0.05) CHECK(wire * 5 < rows * cols * es);
  }
}

TEST_CASE("delta packets: a changed element reaches every target that holds a replica", "[affine][delta]") {
  const TensorInfo info{"norm", DType::f32, {10}};
  const Plan plan = tessera::affine::plan(replicated(info, 3), replicated(info, 1));
  std::vector<float> last(10, 1.f), current = last;
  current[4] = 2.f;
  for (int t = 0; t < 3; ++t) {
    std::vector<float> target = last;
    std::vector<uint8_t> packet;
    DeltaPacketStats stats;
    append_delta(plan, 0, t, {current.data(), 10, DType::f32}, {last.data(), 10, DType::f32}, packet, stats);
    CHECK(stats.changed == 1);
    apply_delta(plan, 0, t, packet.data(), packet.size(), 0, {target.data(), 10, DType::f32});
    CHECK(target == current);
  }
}

TEST_CASE("delta packets: a target without the last version is not repaired (negative control)", "[affine][delta]") {
  const TensorInfo info{"w", DType::bf16, {16, 16}};
  const Plan plan = tessera::affine::plan(replicated(info, 1), replicated(info, 1));
  std::vector<uint16_t> last(256, 1), current(256, 1), stale(256, 2);
  current[17] = 9;
  std::vector<uint8_t> packet;
  DeltaPacketStats stats;
  append_delta(plan, 0, 0, {current.data(), 256, DType::bf16}, {last.data(), 256, DType::bf16}, packet, stats);
  CHECK(stats.changed == 1);
  CHECK(packet.size() == 4 + 4 + 2);
  apply_delta(plan, 0, 0, packet.data(), packet.size(), 0, {stale.data(), 256, DType::bf16});
  CHECK(stale[17] == 9);
  CHECK(stale != current);  // only the change arrived; the stale rest stays stale
  // A lying position is refused before anything is written.
  uint32_t far = 300;
  std::memcpy(packet.data() + 4, &far, 4);
  std::vector<uint16_t> untouched(256, 5);
  CHECK_THROWS_WITH(apply_delta(plan, 0, 0, packet.data(), packet.size(), 0, {untouched.data(), 256, DType::bf16}),
                    Catch::Contains("position outside its segment") && Catch::Contains("'w'"));
  CHECK(untouched == std::vector<uint16_t>(256, 5));
}

TEST_CASE("delta packets: a byte limit stops packing before the packet passes it", "[affine][delta]") {
  // Rows on 2 -> columns on 3: several segments per pair; 2% (sparse) or 90% (dense) changed.
  for (const double fraction : {0.02, 0.9}) {
    INFO("changed " << fraction);
    const TensorInfo info{"w", DType::bf16, {64, 48}};
    const Plan plan = tessera::affine::plan(contiguous_split(info, 1, even_split_sizes(48, 3)),
                                            contiguous_split(info, 0, even_split_sizes(64, 2)));
    std::mt19937_64 rng(3);
    std::vector<uint16_t> last(32 * 48), current;
    for (auto& x : last) x = uint16_t(rng());
    current = last;
    std::bernoulli_distribution change(fraction);
    for (auto& x : current)
      if (change(rng)) x ^= 1;
    const LocalBuffer now{current.data(), int64_t(current.size()), DType::bf16},
        before{last.data(), int64_t(last.size()), DType::bf16};
    std::vector<uint8_t> unlimited;
    DeltaPacketStats all;
    REQUIRE(append_delta(plan, 0, 1, now, before, unlimited, all));
    REQUIRE(unlimited.size() > 8);
    // Exactly the size it needs: the same packet.
    std::vector<uint8_t> exact;
    DeltaPacketStats s1;
    CHECK(append_delta(plan, 0, 1, now, before, exact, s1, int64_t(unlimited.size())));
    CHECK(exact == unlimited);
    // One byte less, or half: refused, and the packet never passed the limit.
    for (const int64_t limit : {int64_t(unlimited.size()) - 1, int64_t(unlimited.size()) / 2, int64_t{0}}) {
      std::vector<uint8_t> cut;
      DeltaPacketStats s2;
      CHECK_FALSE(append_delta(plan, 0, 1, now, before, cut, s2, limit));
      CHECK(int64_t(cut.size()) <= limit);
      CHECK(s2.bytes == int64_t(cut.size()));
    }
  }
}
