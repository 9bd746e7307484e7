#include <catch2/catch.hpp>

#include <cstring>

#include "core/affine/builders.h"
#include "core/affine/chunking.h"
#include "core/affine/errors.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/affine/zero_storage.h"
#include "oracle.h"

using namespace tessera::affine;
namespace affine = tessera::affine;
using namespace tessera::affine::testing;

namespace {

TensorMap rows(int64_t r, int64_t c, int degree, const std::string& name = "w") {
  return contiguous_split({name, DType::f32, {r, c}}, 0, even_split_sizes(r, degree));
}
TensorMap cols(int64_t r, int64_t c, int degree, const std::string& name = "w") {
  return contiguous_split({name, DType::f32, {r, c}}, 1, even_split_sizes(c, degree));
}

}  // namespace

TEST_CASE("local executor: exact under tiny budgets, direct and through staging", "[affine][executor]") {
  const TensorMap src = rows(16, 8, 2), dst = cols(16, 8, 4);
  const Plan plan = affine::plan(dst, src);
  for (bool staged : {false, true}) {
    for (int64_t budget : {4, 12, 64, 100, 1 << 20}) {
      INFO("staged " << staged << " budget " << budget);
      CHECK(check_transfer(dst, src, plan, staged, budget).empty());
    }
  }
  RankBuffers s = make_source_buffers(src), t = make_target_buffers(dst);
  LocalExecutorOptions small;
  small.staging_bytes = 64;
  const TransferStats stats = execute_local({bind_buffers(plan, s, t)}, small);
  CHECK(stats.bytes_copied == 16 * 8 * 4);
  CHECK(stats.segments == 8);
  CHECK(stats.rounds == 8);  // 512 bytes in 64-byte rounds
  CHECK(stats.chunks >= 8);
}

TEST_CASE("local executor: a batch of 16 plans shares rounds", "[affine][executor]") {
  std::vector<TensorMap> srcs, dsts;
  for (int i = 0; i < 16; ++i) {
    srcs.push_back(rows(16, 16, 2, "t" + std::to_string(i)));
    dsts.push_back(cols(16, 16, 2, "t" + std::to_string(i)));
  }
  std::vector<Plan> plans;
  for (int i = 0; i < 16; ++i) plans.push_back(affine::plan(dsts[static_cast<size_t>(i)], srcs[static_cast<size_t>(i)]));
  std::vector<RankBuffers> s, t, expected;
  for (int i = 0; i < 16; ++i) {
    s.push_back(make_source_buffers(srcs[static_cast<size_t>(i)]));
    t.push_back(make_target_buffers(dsts[static_cast<size_t>(i)]));
    expected.push_back(scatter(dsts[static_cast<size_t>(i)], gather(srcs[static_cast<size_t>(i)], s.back())));
  }
  std::vector<LocalTransfer> batch;
  for (int i = 0; i < 16; ++i) batch.push_back(bind_buffers(plans[static_cast<size_t>(i)], s[static_cast<size_t>(i)], t[static_cast<size_t>(i)]));
  CHECK(execute_local(batch).rounds == 1);
  for (int i = 0; i < 16; ++i) CHECK(compare(t[static_cast<size_t>(i)], expected[static_cast<size_t>(i)]).empty());
  LocalExecutorOptions tight;
  tight.staging_bytes = 128;
  CHECK(execute_local(batch, tight).rounds > 1);
}

TEST_CASE("local executor refusals happen before any byte moves", "[affine][executor]") {
  const TensorMap src = rows(8, 8, 2), dst = cols(8, 8, 4);
  const Plan plan = affine::plan(dst, src);
  RankBuffers s = make_source_buffers(src), t = make_target_buffers(dst);
  const RankBuffers untouched = t;
  auto unchanged = [&] { return compare(t, untouched).empty(); };

  SECTION("dtype mismatch") {
    LocalTransfer tr = bind_buffers(plan, s, t);
    tr.target_buffers[2].dtype = DType::bf16;
    CHECK_THROWS_WITH(execute_local({tr}), Catch::Contains("dtype"));
  }
  SECTION("segment past the buffer") {
    LocalTransfer tr = bind_buffers(plan, s, t);
    tr.target_buffers[3].elements = 15;
    CHECK_THROWS_WITH(execute_local({tr}), Catch::Contains("reaches element 15 of a 15-element target buffer"));
  }
  SECTION("missing buffer") {
    LocalTransfer tr = bind_buffers(plan, s, t);
    tr.source_buffers.erase(1);
    CHECK_THROWS_AS(execute_local({tr}), TransferRefusedError);
    // A process validating only its own part (remote path): the missing side is not its business,
    // but what it holds is still checked.
    LocalExecutorOptions held;
    held.only_held_buffers = true;
    CHECK_NOTHROW(validate_local_batch({tr}, held));
    tr.target_buffers[3].elements = 15;
    CHECK_THROWS_AS(validate_local_batch({tr}, held), TransferRefusedError);
    CHECK_THROWS_AS(execute_local({tr}, held), TransferRefusedError);
  }
  SECTION("two target ranks aliasing one buffer (master == weight partition)") {
    LocalTransfer tr = bind_buffers(plan, s, t);
    tr.target_buffers[1].data = tr.target_buffers[0].data;
    CHECK_THROWS_WITH(execute_local({tr}), Catch::Contains("write the same target bytes"));
  }
  SECTION("two requests whose targets overlap") {
    const Plan again = affine::plan(dst, src);
    CHECK_THROWS_AS(execute_local({bind_buffers(plan, s, t), bind_buffers(again, s, t)}), TransferRefusedError);
  }
  SECTION("a source aliasing a target") {
    LocalTransfer tr = bind_buffers(plan, s, t);
    tr.source_buffers[0].data = static_cast<uint32_t*>(tr.target_buffers[3].data) + 4;
    tr.source_buffers[0].elements = 8;  // stays inside, still refused
    tr.source_buffers[0].elements = 32;
    CHECK_THROWS_WITH(execute_local({tr}), Catch::Contains("alias"));
  }
  SECTION("a budget smaller than one element") {
    LocalExecutorOptions o;
    o.staging_bytes = 3;
    CHECK_THROWS_AS(execute_local({bind_buffers(plan, s, t)}, o), BudgetExceededError);
  }
  SECTION("a corrupted plan writing one target twice") {
    Plan twice = plan;
    twice.segments[1].target_offset = twice.segments[0].target_offset;
    twice.segments[1].target_rank = twice.segments[0].target_rank;
    CHECK_THROWS_AS(execute_local({bind_buffers(twice, s, t)}), TransferRefusedError);
  }
  CHECK(unchanged());
  for (const auto& [rank, b] : t) CHECK(b.padding_intact());
}

TEST_CASE("interleaved (strided) targets in one buffer are accepted when disjoint", "[affine][executor]") {
  // Two tensors' column halves interleave in one shared (4, 6) buffer.
  TensorMap a = replicated({"a", DType::f32, {4, 3}}, 1), b = replicated({"b", DType::f32, {4, 3}}, 1);
  a.ranks[0].buffer_elements = b.ranks[0].buffer_elements = 24;
  a.ranks[0].buffer_shape = b.ranks[0].buffer_shape = Dims();
  a.ranks[0].pieces[0].strides = b.ranks[0].pieces[0].strides = {6, 1};
  b.ranks[0].pieces[0].offset = 3;
  const TensorMap sa = replicated({"a", DType::f32, {4, 3}}, 1), sb = replicated({"b", DType::f32, {4, 3}}, 1);
  const Plan pa = affine::plan(a, sa), pb = affine::plan(b, sb);
  RankBuffers s1 = make_source_buffers(sa), s2 = make_source_buffers(sb), shared = make_target_buffers(a);
  std::vector<LocalTransfer> batch = {bind_buffers(pa, s1, shared), bind_buffers(pb, s2, shared)};
  execute_local(batch);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      CHECK(shared.at(0).data()[i * 6 + j] == static_cast<uint32_t>(i * 3 + j + 1));
      CHECK(shared.at(0).data()[i * 6 + 3 + j] == static_cast<uint32_t>(i * 3 + j + 1));
    }
  }
  // Shift b by one column: now they collide.
  b.ranks[0].pieces[0].offset = 2;
  const Plan pb2 = affine::plan(b, sb);
  CHECK_THROWS_AS(execute_local({bind_buffers(pa, s1, shared), bind_buffers(pb2, s2, shared)}), TransferRefusedError);
}

TEST_CASE("chunking sizes chunks by their true byte count", "[affine][executor]") {
  Segment flat;
  flat.shape = {50000000};
  flat.source_strides = flat.target_strides = {1};
  const auto chunks = chunk_segment(flat, 4, int64_t{64} << 20);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].shape == Dims({16777216}));
  CHECK(chunks[2].shape == Dims({16445568}));
  Segment tall;
  tall.shape = {1000000, 8};
  tall.source_strides = tall.target_strides = {8, 1};
  const auto rows_chunks = chunk_segment(tall, 4, int64_t{8} << 20);
  REQUIRE(rows_chunks.size() == 4);
  CHECK(rows_chunks[0].shape == Dims({262144, 8}));
  for (const auto& c : rows_chunks) CHECK(c.bytes <= int64_t{8} << 20);
  // One row larger than the budget is cut along the next axis.
  Segment wide;
  wide.shape = {2, 10};
  wide.source_strides = wide.target_strides = {10, 1};
  const auto w = chunk_segment(wide, 4, 16);
  CHECK(w.size() == 6);  // each row: 4 + 4 + 2 elements
  int64_t total = 0;
  for (const auto& c : w) total += c.bytes;
  CHECK(total == 80);
}

namespace {

// Executes `plan` on buffers of element type T (bit patterns distinct per element) and compares with
// an element-by-element expectation computed from the maps.
template <class T>
void check_typed(const TensorMap& target, const TensorMap& source, DType dtype) {
  const Plan plan = affine::plan(target, source);
  REQUIRE(plan.dtype == dtype);
  auto value = [](int64_t linear) { return static_cast<T>(linear * 37 + 5); };
  std::map<int, std::vector<T>> src, dst, expected;
  for (const auto& [rank, st] : source.ranks) {
    auto& v = src[rank];
    v.assign(static_cast<size_t>(st.buffer_elements), T(0));
    for (const auto& p : st.pieces)
      for_each_element(source.shape, p, [&](int64_t lin, int64_t addr) { v[static_cast<size_t>(addr)] = value(lin); });
  }
  for (const auto& [rank, st] : target.ranks) {
    dst[rank].assign(static_cast<size_t>(st.buffer_elements), T(1));
    auto& e = expected[rank];
    e.assign(static_cast<size_t>(st.buffer_elements), T(1));
    for (const auto& p : st.pieces)
      for_each_element(target.shape, p, [&](int64_t lin, int64_t addr) { e[static_cast<size_t>(addr)] = value(lin); });
  }
  for (bool staged : {false, true}) {
    LocalTransfer tr;
    tr.plan = &plan;
    for (auto& [r, v] : src) tr.source_buffers[r] = LocalBuffer{v.data(), static_cast<int64_t>(v.size()), dtype};
    for (auto& [r, v] : dst) tr.target_buffers[r] = LocalBuffer{v.data(), static_cast<int64_t>(v.size()), dtype};
    LocalExecutorOptions o;
    o.through_staging = staged;
    o.staging_bytes = 3 * static_cast<int64_t>(sizeof(T)) + 1;
    execute_local({tr}, o);
    CHECK(dst == expected);
  }
}

TensorMap transposed(const TensorInfo& info) {  // one rank, column-major storage
  TensorMap m = replicated(info, 1);
  m.ranks[0].buffer_shape = Dims();
  m.ranks[0].pieces[0].strides = {1, info.shape[0]};
  return m;
}

}  // namespace

TEST_CASE("local executor: 1, 2, 4 and 8-byte elements, strided innermost axes", "[affine][executor]") {
  // Column-major targets make the innermost axis strided on one side: the element loop, per size.
  for (DType dtype : {DType::i8, DType::bf16, DType::f16, DType::f32, DType::f64}) {
    const TensorInfo info{"w", dtype, {6, 5}};
    const TensorMap src = contiguous_split(info, 0, {4, 2});
    INFO(dtype_name(dtype));
    switch (element_size(dtype)) {
      case 1: check_typed<uint8_t>(transposed(info), src, dtype); break;
      case 2: check_typed<uint16_t>(transposed(info), src, dtype); break;
      case 4: check_typed<uint32_t>(transposed(info), src, dtype); break;
      default: check_typed<uint64_t>(transposed(info), src, dtype);
    }
  }
  check_typed<uint16_t>(contiguous_split({"w", DType::bf16, {7, 9}}, 1, {2, 3, 4}),
                        contiguous_split({"w", DType::bf16, {7, 9}}, 0, {3, 4}), DType::bf16);
}
