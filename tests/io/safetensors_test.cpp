// safetensors round trips (bitwise, every dtype, 0-d, empty, non-contiguous, NaN payloads) and the
// format against a file built by hand from the specification.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

#include "core/io/safetensors.h"
#include "tests/io/tensor_bytes.h"
#include "tests/io/test_util.h"

namespace {

using namespace tessera::io;
using tessera::io::test::bitwise_equal;
using tessera::io::test::bytes_of;
using tessera::io::test::TempDir;

std::vector<std::pair<std::string, at::Tensor>> every_kind_of_tensor() {
  torch::manual_seed(7);
  at::Tensor f32 = torch::randn({3, 5});
  // Bit patterns a value comparison would lose: a quiet NaN with payload, a negative NaN, -0.0.
  f32.view(at::kInt).view({-1})[0] = 0x7fc00123;
  f32.view(at::kInt).view({-1})[1] = int32_t(0xffc00001u);
  f32.view(at::kInt).view({-1})[2] = int32_t(0x80000000u);
  at::Tensor f16 = torch::randn({7}).to(at::kHalf);
  f16.view(at::kShort)[0] = int16_t(0x7e01);  // NaN with payload
  f16.view(at::kShort)[1] = int16_t(0x8000);  // -0.0
  at::Tensor bf16 = torch::randn({2, 3, 4}).to(at::kBFloat16);
  bf16.view(at::kShort).view({-1})[5] = int16_t(0x7fc1);
  return {
      {"f32", f32},
      {"f16", f16},
      {"bf16", bf16},
      {"f64.scalar", torch::scalar_tensor(-3.25, at::kDouble)},
      {"f64", torch::randn({4, 1}, at::kDouble)},
      {"i64", torch::arange(-5, 5, at::kLong)},
      {"i32", torch::randint(-1000, 1000, {4, 4}, at::kInt)},
      {"i16", torch::randint(-30000, 30000, {9}, at::kShort)},
      {"i8", torch::randint(-128, 128, {3, 3}, at::kChar)},
      {"u8", torch::randint(0, 256, {10}, at::kByte)},
      {"u8.scalar", torch::scalar_tensor(200, at::kByte)},
      {"bool", torch::randint(0, 2, {6}).to(at::kBool)},
      {"empty", torch::zeros({0, 4})},
      {"empty.i64", torch::zeros({0}, at::kLong)},
      {"transposed", torch::randn({4, 6}).t()},  // non-contiguous input, stored as [6, 4]
      {"sliced", torch::arange(40, at::kInt).view({8, 5}).slice(1, 1, 4)},
  };
}

TEST_CASE("safetensors: write then read is bitwise the input for every dtype and shape", "[safetensors]") {
  TempDir dir;
  const auto tensors = every_kind_of_tensor();
  REQUIRE_FALSE(tensors[14].second.is_contiguous());
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "gr\xc3\xbc\xc3\x9f \"quoted\""}};
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, tensors, metadata);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  const SafetensorsFile file(path);
  CHECK(file.path() == path);
  CHECK(file.header().metadata == metadata);
  CHECK(file.header().tensors.size() == tensors.size());
  CHECK(file.header().header_bytes % 8 == 0);
  for (const auto& [name, tensor] : tensors) {
    INFO(name);
    REQUIRE(file.contains(name));
    const at::Tensor back = file.read(name);
    CHECK(back.is_contiguous());
    CHECK(back.device().is_cpu());
    CHECK(bitwise_equal(back, tensor));
    // read_into a preallocated tensor gives the same bytes.
    at::Tensor into = at::empty(tensor.sizes(), tensor.options());
    if (into.numel() > 0) bytes_of(into).fill_(0xAB);
    file.read_into(name, into);
    CHECK(bitwise_equal(into, tensor));
  }
  CHECK(file.read("f64.scalar").dim() == 0);
  CHECK(file.read("transposed").sizes() == at::IntArrayRef({6, 4}));
  CHECK_FALSE(file.contains("missing"));
}

TEST_CASE("safetensors: an empty tensor list and empty metadata round trip", "[safetensors]") {
  TempDir dir;
  write_safetensors(dir.file("none.safetensors"), {});
  const SafetensorsFile file(dir.file("none.safetensors"));
  CHECK(file.header().tensors.empty());
  CHECK(file.header().metadata.empty());
  CHECK(file.header().data_bytes == 0);
}

TEST_CASE("safetensors: a file built by hand from the specification reads correctly", "[safetensors]") {
  TempDir dir;
  // Offsets derived by hand: "a" F32 [3] = 12 bytes at [0, 12), "b" I32 [2] = 8 bytes at [12, 20).
  // The header is unpadded (readers must not require padding) and lists "b" before "a".
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I32","shape":[2],"data_offsets":[12,20]},)"
      R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  // 1.0f = 0x3f800000, -2.5f = 0xc0200000, 0.5f = 0x3f000000 (little-endian), then int32 7 and -1.
  const std::string data("\x00\x00\x80\x3f\x00\x00\x20\xc0\x00\x00\x00\x3f"
                         "\x07\x00\x00\x00\xff\xff\xff\xff",
                         20);
  for (const std::string& padding : {std::string(), std::string(5, ' ')}) {
    const std::string path = dir.file("hand.safetensors");
    tessera::io::test::write_raw_safetensors(path, json + padding, data);
    const SafetensorsFile file(path);
    CHECK(file.header().header_bytes == json.size() + padding.size());
    CHECK(file.header().data_bytes == 20);
    REQUIRE(file.header().tensors.size() == 2);
    CHECK(file.header().tensors[0].name == "a");  // sorted by begin
    CHECK(file.header().tensors[1].begin == 12);
    CHECK(file.header().metadata.at("format") == "pt");
    CHECK(torch::equal(file.read("a"), torch::tensor({1.0f, -2.5f, 0.5f})));
    CHECK(torch::equal(file.read("b"), torch::tensor({7, -1}, at::kInt)));
    CHECK(file.header().find("b")->dtype == StDtype::i32);
    CHECK(file.header().find("c") == nullptr);
  }
}

TEST_CASE("safetensors: the writer's header is the specification's JSON", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const at::Tensor x = torch::arange(6, at::kFloat).view({2, 3});
  const at::Tensor y = torch::ones({4}, at::kBFloat16);
  const at::Tensor s = torch::scalar_tensor(int64_t(-9), at::kLong);
  write_safetensors(path, {{"x", x}, {"y", y}, {"s", s}}, {{"format", "pt"}});

  const std::string bytes = tessera::io::test::read_file_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  CHECK(n % 8 == 0);
  // x: 6 * 4 = 24 bytes at [0, 24); y: 4 * 2 = 8 at [24, 32); s: 8 at [32, 40), in the given order.
  REQUIRE(bytes.size() == 8 + n + 40);
  const std::string header = bytes.substr(8, n);
  const auto j = nlohmann::json::parse(header);
  CHECK(j["__metadata__"] == nlohmann::json({{"format", "pt"}}));
  CHECK(j["x"] == nlohmann::json({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}));
  CHECK(j["y"] == nlohmann::json({{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {24, 32}}}));
  CHECK(j["s"] == nlohmann::json({{"dtype", "I64"}, {"shape", nlohmann::json::array()}, {"data_offsets", {32, 40}}}));
  CHECK(j.size() == 4);
  CHECK(std::memcmp(bytes.data() + 8 + n, x.data_ptr(), 24) == 0);
  CHECK(std::memcmp(bytes.data() + 8 + n + 24, y.data_ptr(), 8) == 0);
  CHECK(std::memcmp(bytes.data() + 8 + n + 32, s.data_ptr(), 8) == 0);
}

TEST_CASE("safetensors: dtype tables agree", "[safetensors]") {
  for (StDtype dtype : {StDtype::f32, StDtype::f16, StDtype::bf16, StDtype::f64, StDtype::i64, StDtype::i32,
                        StDtype::i16, StDtype::i8, StDtype::u8, StDtype::boolean}) {
    CHECK(from_scalar_type(to_scalar_type(dtype)) == dtype);
    CHECK(element_size(dtype) == c10::elementSize(to_scalar_type(dtype)));
  }
  CHECK(std::string(dtype_name(StDtype::bf16)) == "BF16");
  CHECK(std::string(dtype_name(StDtype::boolean)) == "BOOL");
  CHECK_THROWS_AS(from_scalar_type(at::kComplexFloat), tessera::CheckpointError);
}

}  // namespace
