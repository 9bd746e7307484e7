// segment_digests: what the source side hashes from its buffers equals what the target side
// hashes after the transfer, pair by pair; one changed byte changes exactly its pair's digest.
#include <catch2/catch.hpp>

#include <cstring>
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
