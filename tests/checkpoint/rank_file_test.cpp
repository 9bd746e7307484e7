// The rank-file writer and the removal of replaced tags, on real files in a temporary directory.
// write_rank_file's bytes against io::write_safetensors writing the same tensors (an independent
// writer of the same format), its hashes against hashes computed from the file read back; the
// background removal and leftover clearing against the directory's listing afterwards.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "core/checkpoint/background_removal.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/rank_file_writer.h"
#include "core/error.h"
#include "core/io/safetensors.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::checkpoint;

namespace {

std::string temp_dir(const std::string& name) {
  std::random_device device;
  const auto dir = fs::temp_directory_path() / ("tessera_rank_file_" + name + "_" + std::to_string(device()));
  fs::create_directories(dir);
  return dir.string();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("write_rank_file writes what write_safetensors writes, with the hashes of the bytes on disk", "[rank_file]") {
  const auto dir = temp_dir("bytes");
  torch::manual_seed(3);
  // 70 MiB of fp32 crosses the 64 MiB writeback step and ends in a partial 4 MiB chunk; bf16 with
  // an odd element count ends off a chunk boundary too.
  const auto big = torch::randn({int64_t(70) << 18});
  const auto small = torch::randn({1001}).to(torch::kBFloat16);
  const auto empty = torch::zeros({0});
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {{"master/0", big}, {"param/0", small}, {"exp_avg/1", empty}};
  std::vector<RankFileBuffer> buffers;
  buffers.push_back({"master/0", affine::DType::f32, big.data_ptr(), int64_t(big.nbytes())});
  buffers.push_back({"param/0", affine::DType::bf16, small.data_ptr(), int64_t(small.nbytes())});
  buffers.push_back({"exp_avg/1", affine::DType::f32, nullptr, 0});
  const auto path = dir + "/rank1.safetensors";
  const auto entry = write_rank_file(path, 1, buffers);
  io::write_safetensors(dir + "/oracle.safetensors", tensors, {{"format", "tessera.checkpoint.rank"}, {"rank", "1"}});
  const auto written = file_bytes(path);
  CHECK(written == file_bytes(dir + "/oracle.safetensors"));
  CHECK(entry.file == "rank1.safetensors");
  CHECK(entry.rank == 1);
  CHECK(entry.bytes == int64_t(written.size()));
  CHECK(entry.hash == hash_file(path));
  REQUIRE(entry.buffers.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    const auto& b = entry.buffers[i];
    const int64_t bytes = buffers[i].bytes;
    CHECK(b.key == buffers[i].key);
    CHECK(b.elements == tensors[i].second.numel());
    CHECK(b.chunk_bytes == kChunkBytes);
    CHECK(b.chunk_hashes == chunk_hashes(written.data() + b.data_offset, bytes));
  }
  CHECK(entry.buffers[0].chunk_hashes.size() == 18);  // 17 whole chunks and a partial one
  CHECK(entry.buffers[2].chunk_hashes.empty());
  fs::remove_all(dir);
}

TEST_CASE("write_rank_file refuses a ragged buffer and an existing file before writing", "[rank_file]") {
  const auto dir = temp_dir("refuse");
  const float values[3] = {1, 2, 3};
  const auto path = dir + "/rank0.safetensors";
  try {
    write_rank_file(path, 0, {{"master/0", affine::DType::f32, values, 10}});
    FAIL("a 10-byte fp32 buffer was accepted");
  } catch (const CheckpointError& e) {
    CHECK_THAT(e.what(), Catch::Contains("master/0") && Catch::Contains("10 bytes"));
  }
  CHECK_FALSE(fs::exists(path));
  std::ofstream(path) << "earlier";
  CHECK_THROWS_WITH(write_rank_file(path, 0, {{"master/0", affine::DType::f32, values, 12}}),
                    Catch::Contains(path) && Catch::Contains("cannot be created"));
  CHECK(file_bytes(path) == "earlier");
  fs::remove_all(dir);
}

TEST_CASE("Replaced tags are removed in the background and clearing leftovers skips what is queued", "[rank_file]") {
  const auto root = temp_dir("removal");
  auto make = [&](const std::string& name) {
    fs::create_directories(root + "/" + name + "/sub");
    std::ofstream(root + "/" + name + "/sub/file") << name;
  };
  make(".a.partial-1");
  make(".b.partial-2");
  make("kept");
  // The queued path spelled another way (a doubled separator, a "."): the same directory.
  remove_partials(root, {root + "//./.a.partial-1"});
  CHECK(fs::exists(root + "/.a.partial-1/sub/file"));
  CHECK_FALSE(fs::exists(root + "/.b.partial-2"));
  CHECK(fs::exists(root + "/kept/sub/file"));  // a committed tag is never a leftover
  {
    BackgroundRemoval removal;
    make(".c.partial-3");
    removal.remove({root + "/.a.partial-1"});
    removal.remove({root + "/.c.partial-3", root + "/missing"});  // queued behind; a missing path is no error
    removal.wait();
    CHECK(removal.pending().empty());
    CHECK_FALSE(fs::exists(root + "/.a.partial-1"));
    CHECK_FALSE(fs::exists(root + "/.c.partial-3"));
    make(".d.partial-4");
    removal.remove({root + "/.d.partial-4"});
  }  // the destructor waits for the queue
  CHECK_FALSE(fs::exists(root + "/.d.partial-4"));
  CHECK(fs::exists(root + "/kept/sub/file"));
  fs::remove_all(root);
}
