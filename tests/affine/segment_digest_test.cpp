// segment_digests: what the source side hashes from its buffers equals what the target side
// hashes after the transfer, pair by pair; one changed byte changes exactly its pair's digest; and
// every digest is XXH3 of its pair's bytes in plan order (an oracle that copies them out first).
#include <catch2/catch.hpp>

#include <xxhash.h>

#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "core/affine/builders.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/affine/segment_digest.h"

using namespace tessera::affine;

TEST_CASE("segment digests: both ends agree pair by pair; one flipped byte is caught in its pair", "[affine][digest]") {
  const TensorInfo info{"w", DType::f32, {8, 8}};
  const auto source = contiguous_split(info, 0, even_split_sizes(8, 2));  // rows on 2
  const auto target = contiguous_split(info, 1, even_split_sizes(8, 4));  // columns on 4 (strided reads)
  const Plan plan = tessera::affine::plan(target, source);
  std::vector<std::vector<float>> src(2, std::vector<float>(32)), dst(4, std::vector<float>(16, -1.f));
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 32; ++i) src[r][i] = float(r * 100 + i) + 0.5f;
  LocalTransfer t;
  t.plan = &plan;
  for (int r = 0; r < 2; ++r) t.source_buffers[r] = {src[r].data(), 32, DType::f32};
  for (int r = 0; r < 4; ++r) t.target_buffers[r] = {dst[r].data(), 16, DType::f32};
  execute_local({t});
  const auto sent = segment_digests(plan, t.source_buffers, true);
  auto received = segment_digests(plan, t.target_buffers, false);
  CHECK(sent.size() == 8);  // every (row half, column quarter) pair
  CHECK(sent == received);
  // Only rank 2's own pairs, when only its buffer is given.
  const auto rank2 = segment_digests(plan, {{2, t.target_buffers.at(2)}}, false);
  CHECK(rank2.size() == 2);
  CHECK(rank2.at({0, 2}) == sent.at({0, 2}));
  // Flip one byte of target rank 3 in what source rank 1 sent it (rows 4..7 of columns 6..7).
  reinterpret_cast<uint8_t*>(dst[3].data())[4 * 2 * 4 + 1] ^= 0x01;
  received = segment_digests(plan, t.target_buffers, false);
  for (const auto& [pair, digest] : sent) CHECK((digest == received.at(pair)) == (pair != std::make_pair(1, 3)));
}

TEST_CASE("segment digests equal XXH3 of each pair's bytes laid end to end, in plan order", "[affine][digest]") {
  // Oracle: for every pair, its segments' elements copied out in plan order, each segment in
  // row-major index order, then one XXH3 call. Rows on 3 -> columns on 2 of a (6, 10) tensor, plus
  // a 3-D (2, 3, 4) one split on its last axis: pairs with several segments of different shapes.
  for (const auto& [info, source, target] :
       {std::tuple{TensorInfo{"w", DType::f32, {6, 10}}, 0, 1}, std::tuple{TensorInfo{"v", DType::f32, {2, 3, 4}}, 2, 0}}) {
    const int nd = int(info.shape.size());
    int64_t numel = 1;
    for (int k = 0; k < nd; ++k) numel *= info.shape[k];
    const Plan plan = tessera::affine::plan(contiguous_split(info, target, even_split_sizes(info.shape[target], 2)),
                                            contiguous_split(info, source, even_split_sizes(info.shape[source], 3)));
    std::vector<std::vector<float>> src(3, std::vector<float>(size_t(numel)));
    for (int r = 0; r < 3; ++r)
      for (int64_t i = 0; i < numel; ++i) src[size_t(r)][size_t(i)] = float(r * 1000 + i) + 0.25f;
    std::map<int, LocalBuffer> buffers;
    for (int r = 0; r < 3; ++r) buffers[r] = {src[size_t(r)].data(), numel, DType::f32};
    std::map<std::pair<int, int>, std::vector<float>> bytes;
    for (const auto& s : plan.segments) {
      auto& out = bytes[{s.source_rank, s.target_rank}];
      const int snd = s.shape.size();  // the planner may merge axes: the segment's own rank
      std::vector<int64_t> index(size_t(snd), 0);
      for (int64_t e = 0; e < s.elements(); ++e) {
        int64_t at = s.source_offset;
        for (int k = 0; k < snd; ++k) at += index[size_t(k)] * s.source_strides[k];
        out.push_back(src[size_t(s.source_rank)][size_t(at)]);
        for (int k = snd - 1; k >= 0 && ++index[size_t(k)] == s.shape[k]; --k) index[size_t(k)] = 0;
      }
    }
    const auto digests = segment_digests(plan, buffers, true);
    REQUIRE(digests.size() == bytes.size());
    for (const auto& [pair, values] : bytes) {
      INFO(info.name << " pair " << pair.first << " -> " << pair.second);
      CHECK(digests.at(pair) == XXH3_64bits(values.data(), values.size() * sizeof(float)));
    }
  }
}
