// Every malformed safetensors file, header and misuse is refused with a tessera::CheckpointError
// whose message names the file (and the tensor where there is one); a failed read_into leaves its
// destination as it was.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>

#include "core/io/safetensors.h"
#include "tests/io/test_util.h"

namespace {

using namespace tessera::io;
using Catch::Matchers::Contains;
using tessera::io::test::refusal;
using tessera::io::test::TempDir;
using tessera::io::test::write_raw_safetensors;

// A header of one tensor "w" with the given dtype, shape and offsets, as JSON text.
std::string one_tensor(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
}

std::string open_refusal(const std::string& path) {
  return refusal([&] { SafetensorsFile file(path); });
}

TEST_CASE("malformed: files shorter than they claim are refused as truncated", "[malformed]") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_safetensors(path, {{"first", torch::ones({4})}, {"last", torch::ones({8})}});
  const uint64_t size = std::filesystem::file_size(path);
  SECTION("data cut by 3 bytes: the last tensor reaches beyond the data section") {
    std::filesystem::resize_file(path, size - 3);
    const std::string message = open_refusal(path);
    CHECK_THAT(message, Contains(path) && Contains("truncated") && Contains("'last'"));
  }
  SECTION("cut inside the header") {
    std::filesystem::resize_file(path, 8 + 10);
    CHECK_THAT(open_refusal(path), Contains(path) && Contains("truncated"));
  }
  SECTION("shorter than the 8-byte length") {
    std::filesystem::resize_file(path, 5);
    CHECK_THAT(open_refusal(path), Contains(path) && Contains("truncated"));
  }
  SECTION("empty file") {
    std::filesystem::resize_file(path, 0);
    CHECK_THAT(open_refusal(path), Contains(path) && Contains("truncated"));
  }
}

TEST_CASE("malformed: header length N out of range", "[malformed]") {
  TempDir dir;
  const std::string path = dir.file("n.safetensors");
  SECTION("N larger than the file") {
    tessera::io::test::write_file_bytes(path, tessera::io::test::le64(1000) + "{}");
    CHECK_THAT(open_refusal(path), Contains(path) && Contains("truncated"));
  }
  SECTION("N = 0") {
    tessera::io::test::write_file_bytes(path, tessera::io::test::le64(0) + "{}");
    CHECK_THAT(open_refusal(path), Contains(path) && Contains("length is 0"));
  }
  SECTION("N near 2^64 (no overflow in N + 8)") {
    tessera::io::test::write_file_bytes(path, tessera::io::test::le64(~uint64_t(0) - 3) + "{}");
    CHECK_THAT(open_refusal(path), Contains(path) && Contains("exceeds"));
  }
  SECTION("missing file and a directory") {
    CHECK_THAT(open_refusal(dir.file("absent.safetensors")), Contains("absent.safetensors"));
    CHECK_THAT(open_refusal(dir.path()), Contains(dir.path()));
  }
}

TEST_CASE("malformed: headers that lie about the data are refused naming the tensor", "[malformed]") {
  TempDir dir;
  const std::string path = dir.file("h.safetensors");
  struct Case {
    const char* what;
    std::string json;
    size_t data_bytes;
    std::vector<std::string> expected;  // substrings of the message besides the path
  };
  const std::vector<Case> cases = {
      {"end beyond data", one_tensor("F32", "[4]", "[0,16]"), 8, {"'w'", "truncated"}},
      {"size mismatch with shape", one_tensor("F32", "[3]", "[0,16]"), 16, {"'w'", "needs 12"}},
      {"begin > end", one_tensor("F32", "[0]", "[8,4]"), 8, {"'w'", "begin > end"}},
      {"overlapping",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, {"'b'", "overlap", "'a'"}},
      {"hole",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       20, {"'b'", "hole"}},
      {"trailing bytes", one_tensor("F32", "[2]", "[0,8]"), 12, {"trailing"}},
      {"unknown dtype", one_tensor("F8X", "[2]", "[0,2]"), 2, {"'w'", "F8X"}},
      {"negative shape", one_tensor("F32", "[-1]", "[0,4]"), 4, {"'w'", "-1"}},
      {"fractional shape", one_tensor("F32", "[1.5]", "[0,4]"), 4, {"'w'", "1.5"}},
      {"numel overflow", one_tensor("U8", "[4294967296,4294967296]", "[0,0]"), 0, {"'w'", "2^64"}},
      {"bytes overflow", one_tensor("F64", "[2305843009213693952]", "[0,0]"), 0, {"'w'", "2^63"}},
      {"offsets not two", one_tensor("F32", "[1]", "[0,4,8]"), 4, {"'w'", "data_offsets"}},
      {"offsets negative", one_tensor("F32", "[1]", "[-4,0]"), 4, {"'w'", "data_offsets"}},
      {"offsets too big", one_tensor("F32", "[1]", "[0,18446744073709551616]"), 4, {"'w'", "data_offsets"}},
      {"shape not an array", one_tensor("F32", "4", "[0,16]"), 16, {"'w'", "shape"}},
      {"missing field", R"({"w":{"dtype":"F32","shape":[1]}})", 4, {"'w'", "data_offsets"}},
      {"extra field", R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,4],"x":1}})", 4, {"'w'", "\"x\""}},
      {"entry not an object", R"({"w":[1,2]})", 0, {"'w'", "not an object"}},
      {"duplicate names",
       R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2, {"duplicate", "\"w\""}},
      {"metadata not an object", R"({"__metadata__":[1]})", 0, {"__metadata__"}},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", 0, {"__metadata__", "\"k\""}},
      {"non-JSON header", "this is not json", 0, {"JSON"}},
      {"top level array", "[1, 2]", 0, {"top level"}},
      {"number out of range", one_tensor("F32", "[1e999]", "[0,4]"), 4, {"JSON"}},
      {"invalid UTF-8", "{\"w\xff\":{}}", 0, {"JSON"}},
  };
  for (const Case& c : cases) {
    INFO(c.what << ": " << c.json);
    write_raw_safetensors(path, c.json, std::string(c.data_bytes, '\0'));
    const std::string message = open_refusal(path);
    CHECK_THAT(message, Contains(path));
    for (const auto& part : c.expected) CHECK_THAT(message, Contains(part));
    // The parser alone, too: same refusal without a file.
    CHECK_THROWS_AS(parse_safetensors_header(c.json, c.data_bytes, path), tessera::CheckpointError);
  }
}

TEST_CASE("malformed: reading a missing tensor or into a wrong destination", "[malformed]") {
  TempDir dir;
  const std::string path = dir.file("r.safetensors");
  write_safetensors(path, {{"m", torch::arange(6, at::kFloat).view({2, 3})}});
  const SafetensorsFile file(path);
  CHECK_THAT(refusal([&] { file.read("nope"); }), Contains(path) && Contains("no tensor 'nope'"));
  CHECK_THAT(refusal([&] { file.read_into("nope", torch::empty({2, 3})); }), Contains("no tensor 'nope'"));

  auto check_untouched = [&](at::Tensor destination, const std::vector<std::string>& expected) {
    destination.fill_(42);
    const at::Tensor before = destination.clone();
    const std::string message = refusal([&] { file.read_into("m", destination); });
    CHECK_THAT(message, Contains(path) && Contains("'m'") && Contains("F32 [2, 3]"));
    for (const auto& part : expected) CHECK_THAT(message, Contains(part));
    CHECK(torch::equal(destination, before));
  };
  check_untouched(torch::empty({3, 2}), {"[3, 2]", "shape"});
  check_untouched(torch::empty({2, 3}, at::kDouble), {"Double", "dtype"});
  check_untouched(torch::empty({6}), {"[6]"});
  check_untouched(torch::empty({3, 2}).t(), {"non-contiguous"});
  CHECK_THAT(refusal([&] { file.read_into("m", at::Tensor()); }), Contains("undefined"));
}

TEST_CASE("malformed: BOOL bytes other than 0 and 1", "[malformed]") {
  TempDir dir;
  const std::string path = dir.file("b.safetensors");
  write_raw_safetensors(path, one_tensor("BOOL", "[3]", "[0,3]"), std::string("\x01\x02\x00", 3));
  const SafetensorsFile file(path);
  CHECK_THAT(refusal([&] { file.read("w"); }), Contains(path) && Contains("'w'") && Contains("byte 2"));
  at::Tensor destination = torch::zeros({3}, at::kBool);
  CHECK_THAT(refusal([&] { file.read_into("w", destination); }), Contains("'w'"));
  CHECK_FALSE(destination.any().item<bool>());
}

TEST_CASE("malformed: the writer refuses bad input before creating a file", "[malformed]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  CHECK_THAT(refusal([&] { write_safetensors(path, {{"a", torch::ones({1})}, {"a", torch::ones({2})}}); }),
             Contains(path) && Contains("'a'") && Contains("twice"));
  CHECK_THAT(refusal([&] { write_safetensors(path, {{"c", torch::ones({2}, at::kComplexFloat)}}); }),
             Contains("'c'") && Contains("not supported"));
  CHECK_THAT(refusal([&] { write_safetensors(path, {{"__metadata__", torch::ones({1})}}); }), Contains("reserved"));
  CHECK_THAT(refusal([&] { write_safetensors(path, {{"u", at::Tensor()}}); }), Contains("'u'"));
  CHECK_THAT(refusal([&] { write_safetensors(path, {{"bad\xff", torch::ones({1})}}); }), Contains("UTF-8"));
  CHECK_THAT(refusal([&] { write_safetensors(dir.file("no/such/dir/x.safetensors"), {}); }), Contains("no/such/dir"));
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
