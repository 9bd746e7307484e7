// Hugging Face weight directories: a single model.safetensors, sharded saves with an index, bitwise
// read-back, layout switches between saves, and every kind of broken index refused by name.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <future>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/io/weight_directory.h"
#include "tests/io/tensor_bytes.h"
#include "tests/io/test_util.h"

namespace {

using namespace tessera::io;
using Catch::Matchers::Contains;
using tessera::io::test::bitwise_equal;
using tessera::io::test::read_file_bytes;
using tessera::io::test::refusal;
using tessera::io::test::TempDir;
using tessera::io::test::write_file_bytes;

namespace fs = std::filesystem;

// Data bytes 40, 40, 100, 24, 0, 64 (total 268). With max_shard_bytes = 64 the shards are
// {a} (a + b = 80 > 64), {b}, {c} (100 alone, over the limit), {d, e} (24 + 0), {f} (24 + 64 > 64).
std::vector<std::pair<std::string, at::Tensor>> model_tensors() {
  torch::manual_seed(3);
  return {{"h.0.a", torch::randn({10})},
          {"h.0.b", torch::randn({10})},
          {"h.1.c", torch::randn({50}).to(at::kBFloat16)},
          {"h.1.d", torch::arange(3, at::kLong)},
          {"h.1.e", torch::zeros({0}, at::kByte)},
          {"lm_head.f", torch::randn({4, 4}).t()}};
}

const char* shard(int k) {
  static const char* names[] = {"", "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                                "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                                "model-00005-of-00005.safetensors"};
  return names[k];
}

void check_reads_back(const WeightDirectory& weights, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<std::string> expected;
  for (const auto& [name, tensor] : tensors) expected.push_back(name);
  std::sort(expected.begin(), expected.end());
  CHECK(weights.names() == expected);
  for (const auto& [name, tensor] : tensors) {
    INFO(name);
    REQUIRE(weights.contains(name));
    CHECK(bitwise_equal(weights.read(name), tensor));
    at::Tensor into = at::empty(tensor.sizes(), tensor.options());
    weights.read_into(name, into);
    CHECK(bitwise_equal(into, tensor));
    CHECK(weights.info(name).shape == tensor.sizes().vec());
  }
}

TEST_CASE("weights: everything fits: one model.safetensors", "[weights]") {
  TempDir dir;
  const auto tensors = model_tensors();
  for (uint64_t limit : {uint64_t(0), uint64_t(268)}) {
    save_weight_directory(dir.file("m"), tensors, limit);
    CHECK(fs::exists(dir.file("m/model.safetensors")));
    CHECK_FALSE(fs::exists(dir.file("m/model.safetensors.index.json")));
    const WeightDirectory weights(dir.file("m"));
    CHECK(weights.dir() == dir.file("m"));
    CHECK(weights.files().size() == 1);
    CHECK(weights.files()[0]->header().metadata.at("format") == "pt");
    check_reads_back(weights, tensors);
  }
}

TEST_CASE("weights: sharded save, index and bitwise read-back", "[weights]") {
  TempDir dir;
  const auto tensors = model_tensors();
  save_weight_directory(dir.path(), tensors, 64);
  for (int k = 1; k <= 5; ++k) CHECK(fs::exists(dir.file(shard(k))));
  CHECK_FALSE(fs::exists(dir.file("model.safetensors")));
  const auto index = nlohmann::json::parse(read_file_bytes(dir.file("model.safetensors.index.json")));
  CHECK(index["metadata"]["total_size"] == 268);
  CHECK(index["weight_map"] == nlohmann::json({{"h.0.a", shard(1)},
                                               {"h.0.b", shard(2)},
                                               {"h.1.c", shard(3)},
                                               {"h.1.d", shard(4)},
                                               {"h.1.e", shard(4)},
                                               {"lm_head.f", shard(5)}}));
  const WeightDirectory weights(dir.path());
  CHECK(weights.files().size() == 5);
  check_reads_back(weights, tensors);
  CHECK_THAT(refusal([&] { weights.read("nope"); }), Contains(dir.path()) && Contains("'nope'"));

  // Saving again as one file removes the shards and the index, and back.
  save_weight_directory(dir.path(), tensors);
  CHECK_FALSE(fs::exists(dir.file(shard(1))));
  CHECK_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  check_reads_back(WeightDirectory(dir.path()), tensors);
  save_weight_directory(dir.path(), tensors, 100);  // {a, b} (80), {c} (100), {d, e, f} (88): 3 shards
  CHECK_FALSE(fs::exists(dir.file("model.safetensors")));
  CHECK(fs::exists(dir.file("model-00003-of-00003.safetensors")));
  CHECK_FALSE(fs::exists(dir.file(shard(1))));
  check_reads_back(WeightDirectory(dir.path()), tensors);
}

TEST_CASE("weights: broken indexes are refused naming the index, the shard and the tensor", "[weights]") {
  TempDir dir;
  const auto tensors = model_tensors();
  save_weight_directory(dir.path(), tensors, 64);
  const std::string index_path = dir.file("model.safetensors.index.json");
  const auto good = nlohmann::json::parse(read_file_bytes(index_path));
  auto refused_with = [&](const nlohmann::json& index) {
    write_file_bytes(index_path, index.dump());
    const std::string message = refusal([&] { WeightDirectory weights(dir.path()); });
    CHECK_THAT(message, Contains(index_path));
    return message;
  };

  SECTION("a listed tensor absent from its shard") {
    auto index = good;
    index["weight_map"]["ghost"] = shard(1);
    CHECK_THAT(refused_with(index), Contains("'ghost'") && Contains(shard(1)));
    index = good;
    index["weight_map"]["h.0.a"] = shard(2);  // a lies in shard 1
    CHECK_THAT(refused_with(index), Contains("'h.0.a'") && Contains(shard(2)));
  }
  SECTION("a shard file missing") {
    fs::remove(dir.file(shard(3)));
    CHECK_THAT(refused_with(good), Contains(shard(3)));
  }
  SECTION("a shard name leaving the directory") {
    auto index = good;
    index["weight_map"]["h.0.a"] = "../" + std::string(shard(1));
    CHECK_THAT(refused_with(index), Contains("'h.0.a'") && Contains("../"));
    index["weight_map"]["h.0.a"] = "sub/x.safetensors";
    CHECK_THAT(refused_with(index), Contains("sub/x.safetensors"));
  }
  SECTION("a tensor in two shards") {
    write_safetensors(dir.file("extra.safetensors"), {{"h.0.a", torch::zeros({10})}, {"z", torch::ones({1})}});
    auto index = good;
    index["weight_map"]["z"] = "extra.safetensors";
    CHECK_THAT(refused_with(index), Contains("'h.0.a'") && Contains("two shards") && Contains("extra.safetensors"));
  }
  SECTION("a shard holding a tensor the index does not list") {
    auto index = good;
    index["weight_map"].erase("h.1.e");
    CHECK_THAT(refused_with(index), Contains("'h.1.e'") && Contains(shard(4)));
  }
  SECTION("a corrupt shard") {
    std::filesystem::resize_file(dir.file(shard(5)), 20);
    CHECK_THAT(refused_with(good), Contains(shard(5)) && Contains("truncated"));
  }
  SECTION("index structure") {
    CHECK_THAT(refused_with(nlohmann::json::array()), Contains("top level"));
    CHECK_THAT(refused_with(nlohmann::json({{"metadata", {{"total_size", 1}}}})), Contains("weight_map"));
    auto index = good;
    index["weight_map"]["h.0.a"] = 7;
    CHECK_THAT(refused_with(index), Contains("'h.0.a'"));
    index = good;
    index["metadata"]["total_size"] = "big";
    CHECK_THAT(refused_with(index), Contains("total_size"));
    write_file_bytes(index_path, "{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}");
    CHECK_THAT(refusal([&] { WeightDirectory weights(dir.path()); }), Contains(index_path) && Contains("duplicate"));
    write_file_bytes(index_path, "{not json");
    CHECK_THAT(refusal([&] { WeightDirectory weights(dir.path()); }), Contains(index_path) && Contains("JSON"));
  }
}

TEST_CASE("weights: a directory without weights, and bad tensors to save", "[weights]") {
  TempDir dir;
  CHECK_THAT(refusal([&] { WeightDirectory weights(dir.path()); }), Contains(dir.path()) && Contains("no weights"));
  CHECK_THAT(refusal([&] { save_weight_directory(dir.file("out"), {{"a", torch::ones({1})}, {"a", torch::ones({1})}}); }),
             Contains("'a'") && Contains("twice"));
  CHECK_THAT(refusal([&] { save_weight_directory(dir.file("out"), {{"c", torch::ones({1}, at::kComplexDouble)}}, 1); }),
             Contains("'c'"));
  CHECK_FALSE(fs::exists(dir.file("out")));
}

// Opens `fifo` for writing if `reading` has not finished within 5 s: a reader blocked in open()
// then returns, and the test fails instead of hanging.
void release_if_blocked(std::future<std::string>& reading, const std::string& fifo) {
  if (reading.wait_for(std::chrono::seconds(5)) == std::future_status::ready) return;
  FAIL_CHECK("blocked opening " << fifo);
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  reading.wait();
  if (fd >= 0) ::close(fd);
}

TEST_CASE("weights: a FIFO in place of a weight file is refused at once, by name", "[weights]") {
  TempDir dir;
  for (const std::string name : {"model.safetensors", "model.safetensors.index.json"}) {
    const std::string fifo = dir.file(name);
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    auto reading = std::async(std::launch::async, [&] { return refusal([&] { WeightDirectory weights(dir.path()); }); });
    release_if_blocked(reading, fifo);
    CHECK_THAT(reading.get(), Contains(fifo) && Contains("not a regular file (a FIFO)"));
    fs::remove(fifo);
  }
  // A directory where a shard should be: the same refusal, through the index.
  write_file_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}})");
  fs::create_directory(dir.file("model-00001-of-00001.safetensors"));
  CHECK_THAT(refusal([&] { WeightDirectory weights(dir.path()); }),
             Contains("model-00001-of-00001.safetensors") && Contains("not a regular file (a directory)"));
}

}  // namespace
