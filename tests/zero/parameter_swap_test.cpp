// zero::ParameterSwap against in-memory partitions (the oracle): random reads, writes, read-aheads
// and flushes over partitions several times the buffers give the oracle's bits in every read
// (NaN-filled destinations, wholly overwritten) and in the whole partitions at the end, under
// several chunk sizes and aio settings; host memory stays within the buffers for partitions 16x
// larger (RSS measured); read-ahead serves the next reads; concurrent readers and writers of other
// groups (the parameter- and optimizer-shard) stay exact; a swap file changed or truncated behind
// its back and bad ranges or tensors are OffloadErrors naming the path and flat group; a negative
// control (one element written to the swap only) is seen by the comparison; a disk too small for
// the partitions is refused when the swap is made (zero.swap.full_disk, on a 1 MiB tmpfs).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/zero/parameter_swap.h"
#include "core/zero/sharding_plan.h"
#include "core/zero/stage3_parameters.h"

namespace fs = std::filesystem;
using tessera::zero::ParameterSwap;
using tessera::zero::ParameterSwapOptions;
namespace zero = tessera::zero;

namespace {

std::string swap_path(const std::string& name) {
  const auto dir = fs::temp_directory_path() / "tessera_parameter_swap_test";
  fs::create_directories(dir);
  return (dir / (name + "_" + std::to_string(::getpid()) + ".swap")).string();
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), size_t(a.numel() * a.element_size())) == 0;
}

torch::Tensor nan_filled(int64_t n, torch::ScalarType dtype) { return torch::full({n}, NAN, torch::dtype(dtype)); }

// Partitions of an fp32 and a bf16 group (odd sizes, not multiples of a chunk) and an empty one.
std::vector<torch::Tensor> oracle_partitions() {
  torch::manual_seed(7);
  return {torch::randn({300001}), torch::randn({77777}).to(torch::kBFloat16), torch::empty({0})};
}

std::unique_ptr<ParameterSwap> swap_of(const std::vector<torch::Tensor>& oracle, const std::string& path,
                                       int64_t chunk_bytes, int64_t buffers, tessera::io::AioSettings aio = {}) {
  std::vector<ParameterSwap::Partition> parts;
  for (const auto& t : oracle) parts.push_back({t.scalar_type(), t.numel()});
  ParameterSwapOptions options;
  options.path = path, options.chunk_bytes = chunk_bytes, options.buffers = buffers, options.aio = aio;
  auto swap = std::make_unique<ParameterSwap>(parts, options);
  for (size_t g = 0; g < oracle.size(); ++g) swap->write(int64_t(g), 0, oracle[g]);
  return swap;
}

void expect_whole_equal(ParameterSwap& swap, const std::vector<torch::Tensor>& oracle) {
  for (size_t g = 0; g < oracle.size(); ++g) {
    INFO("flat group " << g);
    CHECK(same_bits(swap.read_whole(int64_t(g)), oracle[g]));
  }
}

int64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * int64_t(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("Random reads and writes through the swap give the in-memory partitions' bits", "[swap]") {
  struct Case { int64_t chunk, buffers, block, threads; bool single, overlap; };
  for (const Case c : {Case{64 << 10, 3, 1 << 20, 1, false, true}, Case{4096, 2, 4096, 2, true, false},
                       Case{100000, 5, 8192, 1, false, false}, Case{8 << 20, 2, 1 << 20, 1, false, true}}) {
    INFO("chunks of " << c.chunk << " bytes, " << c.buffers << " buffers, block " << c.block << ", threads " << c.threads);
    auto oracle = oracle_partitions();
    tessera::io::AioSettings aio;
    aio.block_size = c.block, aio.threads = c.threads, aio.single_submit = c.single, aio.overlap_events = c.overlap;
    auto swap = swap_of(oracle, swap_path("random"), c.chunk, c.buffers, aio);
    const int64_t chunk = (std::min<int64_t>(c.chunk, 300001 * 4) + 4095) / 4096 * 4096;  // at most the largest partition
    std::mt19937_64 rng(11);
    auto pick = [&](int64_t n) { return int64_t(rng() % uint64_t(std::max<int64_t>(n, 1))); };
    int64_t mismatches = 0;
    for (int op = 0; op < 300; ++op) {
      const int64_t g = pick(2), size = oracle[size_t(g)].numel();
      const int64_t begin = pick(size), numel = pick(std::min<int64_t>(size - begin, 70000)) + (begin < size ? 1 : 0);
      int64_t at = begin;
      switch (pick(5)) {
        case 0:  // a write from a chunk's start (a fill, maybe left partial and completed later)
          at = begin / (chunk / oracle[size_t(g)].element_size()) * (chunk / oracle[size_t(g)].element_size());
          [[fallthrough]];
        case 1: {  // an update: new values into the swap and the oracle
          const auto values = torch::randn({numel}).to(oracle[size_t(g)].scalar_type());
          swap->write(g, at, values);
          oracle[size_t(g)].narrow(0, at, numel).copy_(values);
          break;
        }
        case 2: swap->prefetch(g, begin, numel); break;
        case 3: if (pick(4) == 0) swap->flush(); break;
        default: break;
      }
      const auto dst = nan_filled(numel, oracle[size_t(g)].scalar_type());
      swap->read(g, begin, dst);
      mismatches += same_bits(dst, oracle[size_t(g)].narrow(0, begin, numel).contiguous()) ? 0 : 1;
    }
    CHECK(mismatches == 0);
    expect_whole_equal(*swap, oracle);
    const auto stats = swap->stats();
    CHECK(swap->buffer_bytes() >= c.buffers * chunk);
    CHECK(swap->buffer_bytes() <= (c.buffers + 1) * chunk);  // and the scratch chunk of partial fills
    if (swap->file_bytes() > swap->buffer_bytes()) CHECK(stats.io.bytes_read > 0);  // chunks were evicted and read back
    CHECK(stats.io.bytes_written > 0);
    CHECK(stats.io.fsyncs == 0);
  }
}

TEST_CASE("A writer filling chunks from their start reads nothing; a fill left partial is completed from the file", "[swap]") {
  auto oracle = oracle_partitions();
  auto swap = swap_of(oracle, swap_path("fill"), 64 << 10, 3);  // chunks of 16384 fp32 elements
  swap->flush();
  swap->read(1, 0, nan_filled(77777, torch::kBFloat16));  // the buffers hold group 1
  SECTION("sequential fills, pieces smaller than a chunk: no reads") {
    const auto before = swap->stats();
    const auto update = torch::randn({oracle[0].numel()});
    for (int64_t b = 0; b < update.numel(); b += 1000)
      swap->write(0, b, update.narrow(0, b, std::min<int64_t>(1000, update.numel() - b)).contiguous());
    swap->flush();
    CHECK(swap->stats().io.bytes_read == before.io.bytes_read);
    oracle[0].copy_(update);
    expect_whole_equal(*swap, oracle);
  }
  SECTION("a fill left half-way: read, evicted and flushed, the rest comes from the file") {
    const auto half = torch::randn({8192});
    swap->write(0, 16384, half);  // chunk 1's first half; its second half is still in the file only
    oracle[0].narrow(0, 16384, 8192).copy_(half);
    auto dst = nan_filled(100, torch::kFloat);
    swap->read(0, 16384 + 8192 + 50, dst);  // the rest, read now
    CHECK(same_bits(dst, oracle[0].narrow(0, 16384 + 8192 + 50, 100).contiguous()));
    const auto second = torch::randn({4096});
    swap->write(0, 3 * 16384, second);  // chunk 3's first quarter, then evicted by other reads
    oracle[0].narrow(0, 3 * 16384, 4096).copy_(second);
    swap->read(1, 0, nan_filled(77777, torch::kBFloat16));
    const auto third = torch::randn({10});
    swap->write(0, 5 * 16384, third);  // chunk 5 partial at the flush
    oracle[0].narrow(0, 5 * 16384, 10).copy_(third);
    swap->flush();
    expect_whole_equal(*swap, oracle);
  }
}

TEST_CASE("Negative control: one element written to the swap only is seen", "[swap]") {
  auto oracle = oracle_partitions();
  auto swap = swap_of(oracle, swap_path("control"), 64 << 10, 3);
  swap->write(1, 4321, torch::full({1}, 3.0).to(torch::kBFloat16));
  CHECK_FALSE(same_bits(swap->read_whole(1), oracle[1]));
  CHECK(same_bits(swap->read_whole(0), oracle[0]));
}

TEST_CASE("Read-ahead serves the next reads from memory", "[swap]") {
  auto oracle = oracle_partitions();
  auto swap = swap_of(oracle, swap_path("ahead"), 64 << 10, 4);
  swap->flush();
  swap->read(1, 0, nan_filled(20000, torch::kBFloat16));  // none of group 0's first chunks is in the buffers
  const auto before = swap->stats();
  swap->prefetch(0, 0, 40000);  // 160 KB: three chunks read ahead, one buffer left
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto dst = nan_filled(40000, torch::kFloat);
  swap->read(0, 0, dst);
  const auto after = swap->stats();
  CHECK(same_bits(dst, oracle[0].narrow(0, 0, 40000).contiguous()));
  CHECK(after.hits - before.hits == 3);
  CHECK(after.misses == before.misses);
  CHECK(after.io.bytes_read - before.io.bytes_read == 3 * (64 << 10));
}

TEST_CASE("Host memory stays within the buffers for partitions 16x larger", "[swap]") {
  const int64_t n = 16 << 20, piece = 1 << 18;  // 64 MiB of fp32 on disk; 4 buffers of 1 MiB
  ParameterSwapOptions options;
  options.path = swap_path("rss"), options.chunk_bytes = 1 << 20, options.buffers = 4;
  const int64_t before = rss_bytes();
  ParameterSwap swap({{torch::kFloat, n}}, options);
  auto values = [&](int64_t begin) { return torch::arange(begin, begin + piece, torch::kFloat); };
  const auto dst = torch::empty({piece});
  auto pass = [&](bool writing) {
    for (int64_t b = 0; b < n; b += piece) {
      if (writing) swap.write(0, b, values(b));
      swap.prefetch(0, b + piece, b + piece < n ? piece : 0);  // the next piece, read ahead
      swap.read(0, b, dst);
      REQUIRE(same_bits(dst, values(b)));
    }
    swap.flush();
  };
  pass(true);
  const int64_t after_first = rss_bytes();
  pass(false);
  pass(true);
  const int64_t grown = rss_bytes() - before, grown_later = rss_bytes() - after_first;
  INFO("RSS grew by " << grown / 1e6 << " MB (" << grown_later / 1e6 << " MB in passes 2-3); partition "
                      << swap.file_bytes() / 1e6 << " MB, buffers " << swap.buffer_bytes() / 1e6 << " MB");
  CHECK(swap.file_bytes() == n * 4);
  CHECK(swap.buffer_bytes() == 4 << 20);
  // Two more passes add nothing: no chunk stays behind in memory. (What the first pass leaves, the
  // buffers and the allocator's keep of its temporaries, depends on the machine; never the 64 MiB.)
  CHECK(grown_later < (1 << 20));
  CHECK(grown < swap.file_bytes() / 2);
}

TEST_CASE("Readers and writers of other groups at once (the two shards) stay exact", "[swap]") {
  auto oracle = oracle_partitions();
  auto swap = swap_of(oracle, swap_path("threads"), 16 << 10, 3);
  const auto update = torch::randn({oracle[0].numel()});
  std::thread writer([&] {
    for (int64_t b = 0; b < update.numel(); b += 1000)
      swap->write(0, b, update.narrow(0, b, std::min<int64_t>(1000, update.numel() - b)).contiguous());
  });
  int64_t mismatches = 0;
  for (int round = 0; round < 20; ++round) {
    const auto dst = nan_filled(oracle[1].numel(), torch::kBFloat16);
    swap->read(1, 0, dst);
    mismatches += same_bits(dst, oracle[1]) ? 0 : 1;
  }
  writer.join();
  CHECK(mismatches == 0);
  oracle[0].copy_(update);
  expect_whole_equal(*swap, oracle);
}

TEST_CASE("A swap file changed or truncated behind its back is an error naming it", "[swap]") {
  auto oracle = oracle_partitions();
  const auto path = swap_path("tampered");
  auto swap = swap_of(oracle, path, 64 << 10, 2);
  swap->flush();
  swap->read(1, 0, nan_filled(70000, torch::kBFloat16));  // group 0's first chunk leaves the buffers
  SECTION("changed") {
    const int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    const char junk = 0x7f;
    REQUIRE(::pwrite(fd, &junk, 1, 17) == 1);
    ::close(fd);
    try {
      swap->read(0, 10, nan_filled(5, torch::kFloat));
      FAIL("a changed chunk was read");
    } catch (const tessera::OffloadError& e) {
      CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("flat group 0 elements [0, 16384) (chunk 0)") &&
                               Catch::Contains("changed behind the engine's back"));
    }
    // The other chunks are intact.
    const auto dst = nan_filled(1000, torch::kFloat);
    swap->read(0, 20000, dst);
    CHECK(same_bits(dst, oracle[0].narrow(0, 20000, 1000).contiguous()));
  }
  SECTION("truncated") {
    REQUIRE(::truncate(path.c_str(), off_t(swap->file_bytes() / 2)) == 0);
    try {
      swap->read(0, 0, nan_filled(5, torch::kFloat));
      FAIL("a truncated swap file was used");
    } catch (const tessera::OffloadError& e) {
      CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("truncated"));
    }
  }
}

TEST_CASE("Bad ranges, tensors and buffer counts are refused by name before anything changes", "[swap]") {
  auto oracle = oracle_partitions();
  const auto path = swap_path("bad");
  auto swap = swap_of(oracle, path, 64 << 10, 3);
  auto refused = [&](auto&& call, const std::string& says) {
    try {
      call();
      FAIL("accepted: " << says);
    } catch (const tessera::OffloadError& e) {
      CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains(says));
    }
  };
  refused([&] { swap->write(1, 77770, torch::zeros({8}).to(torch::kBFloat16)); },
          "flat group 1 elements [77770, 77778): outside the partition of 77777 elements");
  refused([&] { swap->write(0, 0, torch::zeros({8}, torch::kDouble)); }, "the source is Double, the partition Float");
  refused([&] { swap->read(0, 0, torch::zeros({4, 2})); }, "contiguous 1-D CPU tensor");
  refused([&] { swap->prefetch(3, 0, 1); }, "no flat group 3");
  expect_whole_equal(*swap, oracle);
  ParameterSwapOptions one;
  one.path = swap_path("one"), one.buffers = 1;
  CHECK_THROWS_WITH(ParameterSwap({{torch::kFloat, 10}}, one), Catch::Contains("at least 2 buffers (buffer_count), got 1"));
}

// Run by tests/io/full_disk.py inside a private mount namespace whose TESSERA_FULL_DIR is a 1 MiB tmpfs.
TEST_CASE("Partitions larger than the disk are refused when the swap is made, nothing left behind", "[.full_disk]") {
  const char* dir = std::getenv("TESSERA_FULL_DIR");
  REQUIRE(dir);
  ParameterSwapOptions options;
  options.path = std::string(dir) + "/parameters.swap";
  try {
    ParameterSwap swap({{torch::kBFloat16, 4 << 20}}, options);  // 8 MiB of partition
    FAIL("an 8 MiB partition fitted on a 1 MiB disk");
  } catch (const tessera::OffloadError& e) {
    CHECK_THAT(e.what(), Catch::Contains(options.path) && Catch::Contains("cannot reserve 8388608 bytes") &&
                             Catch::Contains("No space left on device"));
  }
  CHECK_FALSE(fs::exists(options.path));
}

// Stage3Parameters on NVMe lends whole weight buffers (a save, a weight sync) and settles them at
// the next gather: an unchanged one is dropped without a write; one changed, also through a raw
// pointer (as a checkpoint load's executor writes), is written and reads back. Oracle: the values
// written, read back through the swap into a NaN-filled tensor.
TEST_CASE("Lent weight buffers: unchanged ones are not written back, changed ones are", "[swap]") {
  std::vector<zero::PlannedParameter> planned{{"a", {300, 7}, 0, false, "m1"}, {"b", {50}, 0, false, "m2"}};
  zero::ShardingPlanOptions o;
  o.stage = 3, o.world = 1, o.sub_group_elements = 10000;
  const zero::ShardingPlan plan(planned, o);
  std::vector<at::Tensor> params{torch::randn({300, 7}), torch::randn({50})};
  zero::ParameterSwapOptions swap;
  swap.path = swap_path("lent"), swap.chunk_bytes = 4096, swap.buffers = 2;
  zero::Stage3Parameters storage(plan, 0, params, at::kFloat, nullptr, zero::WeightHome::nvme, swap);
  auto written = [&] { return storage.swap()->stats().io.bytes_written; };
  auto lent = storage.weight_buffer(0);
  const auto before = written();
  storage.settle_lent();
  CHECK(written() == before);  // paged in and not changed: nothing to write
  lent = storage.weight_buffer(0);
  std::memset(lent.data_ptr(), 0, 4);  // through a raw pointer: no version counter moves
  const auto expected = lent.clone();
  storage.settle_lent();
  CHECK(written() > before);
  auto back = torch::full_like(expected, std::numeric_limits<float>::quiet_NaN());
  back.copy_(storage.weight_buffer(0));
  CHECK(torch::equal(back, expected));
  storage.settle_lent();
}
