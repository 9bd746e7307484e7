// Random mutations of real safetensors headers through parse_safetensors_header, and of whole files
// through SafetensorsFile: whatever the bytes, the result is either a self-consistent header (the
// tensors tile the data section) or a tessera::Error naming the file, never another exception
// type and never a crash. Bounded in time (TESSERA_FUZZ_SECONDS, default 2); the seed is printed
// and TESSERA_FUZZ_SEED replays it.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>
#include <set>

#include "core/io/safetensors.h"
#include "tests/io/test_util.h"

namespace {

using namespace tessera::io;
using tessera::io::test::TempDir;

struct Seed {
  std::string file;    // the whole file
  std::string header;  // its N header bytes
  uint64_t data_bytes;
};

std::vector<Seed> seed_files(const TempDir& dir) {
  torch::manual_seed(11);
  const std::vector<std::vector<std::pair<std::string, at::Tensor>>> sets = {
      {{"w", torch::randn({2, 3})}},
      {{"wte.weight", torch::randn({16, 4}).to(at::kBFloat16)},
       {"h.0.ln.bias", torch::zeros({4}, at::kHalf)},
       {"step", torch::scalar_tensor(int64_t(12), at::kLong)},
       {"mask", torch::ones({3}, at::kBool)}},
      {{"empty", torch::zeros({0, 3})}, {"also_empty", torch::zeros({0}, at::kInt)}, {"x", torch::ones({1}, at::kChar)}},
      {{"a", torch::ones({2}, at::kDouble)}, {"b", torch::ones({5}, at::kByte)}, {"c", torch::ones({3}, at::kShort)}},
  };
  std::vector<Seed> seeds;
  for (size_t i = 0; i < sets.size(); ++i) {
    const std::string path = dir.file("seed" + std::to_string(i) + ".safetensors");
    write_safetensors(path, sets[i], i % 2 ? std::map<std::string, std::string>{{"format", "pt"}}
                                           : std::map<std::string, std::string>{});
    const SafetensorsFile file(path);
    Seed seed;
    seed.file = tessera::io::test::read_file_bytes(path);
    seed.header = seed.file.substr(8, file.header().header_bytes);
    seed.data_bytes = file.header().data_bytes;
    seeds.push_back(seed);
  }
  return seeds;
}

std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::vector<std::string> tokens = {
      "-1", "1e999", "18446744073709551616", "18446744073709551615", "9223372036854775808", "\"BF16\"", "\"F8X\"",
      "[", "]", "{", "}", ",", ":", "\"", "null", "0", "4294967296", "[]", "{}", "\"__metadata__\"", "\\u0000",
      "\xff", "\"data_offsets\":[0,0]", "\"shape\":[]", "1.5", "true"};
  auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
  const int edits = 1 + int(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = pick(text.size() + 1);
    switch (rng() % 6) {
      case 0: if (!text.empty()) text[pick(text.size())] ^= char(1 << (rng() % 8)); break;
      case 1: text.insert(at, tokens[pick(tokens.size())]); break;
      case 2: text.erase(at, pick(16)); break;
      case 3: text.insert(at, text.substr(pick(text.size()), pick(48))); break;
      case 4: {  // change a digit: offsets and shapes that lie
        const size_t digit = text.find_first_of("0123456789", at);
        if (digit != std::string::npos) text[digit] = char('0' + rng() % 10);
        break;
      }
      default: if (!text.empty()) text[pick(text.size())] = char(rng() % 256);
    }
  }
  return text;
}

// What every successfully parsed header must satisfy.
void check_consistent(const StHeader& header, uint64_t data_bytes) {
  REQUIRE(header.data_bytes == data_bytes);
  uint64_t covered = 0;
  std::set<std::string> names;
  for (const auto& tensor : header.tensors) {
    REQUIRE(names.insert(tensor.name).second);
    REQUIRE(tensor.begin == covered);
    REQUIRE(tensor.end >= tensor.begin);
    uint64_t numel = 1;
    for (int64_t extent : tensor.shape) {
      REQUIRE(extent >= 0);
      numel *= uint64_t(extent);
    }
    REQUIRE(tensor.end - tensor.begin == numel * element_size(tensor.dtype));
    covered = tensor.end;
  }
  REQUIRE(covered == data_bytes);
}

struct FuzzSettings {
  uint64_t seed;
  double seconds;
};

FuzzSettings settings(const char* which) {
  const char* replay = std::getenv("TESSERA_FUZZ_SEED");
  const char* limit = std::getenv("TESSERA_FUZZ_SECONDS");
  FuzzSettings s{replay ? std::strtoull(replay, nullptr, 10) : std::random_device{}(), limit ? std::atof(limit) : 2.0};
  std::cout << which << ": seed " << s.seed << " (replay with TESSERA_FUZZ_SEED=" << s.seed << ")" << std::endl;
  return s;
}

TEST_CASE("fuzz: mutated headers parse consistently or throw tessera::Error", "[fuzz]") {
  TempDir dir;
  const auto seeds = seed_files(dir);
  const FuzzSettings s = settings("fuzz header");
  std::mt19937_64 rng(s.seed);
  const auto start = std::chrono::steady_clock::now();
  int64_t runs = 0, parsed = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < s.seconds) {
    const Seed& seed = seeds[rng() % seeds.size()];
    const std::string text = mutate(seed.header, rng);
    uint64_t data_bytes = seed.data_bytes;
    if (rng() % 8 == 0) data_bytes += uint64_t(int64_t(rng() % 9) - 4);  // also a lying file size
    ++runs;
    try {
      const StHeader header = parse_safetensors_header(text, data_bytes, "fuzz.safetensors");
      ++parsed;
      check_consistent(header, data_bytes);
    } catch (const tessera::Error& e) {
      REQUIRE_THAT(e.what(), Catch::Matchers::Contains("fuzz.safetensors"));
    } catch (const std::exception& e) {
      FAIL("seed " << s.seed << " run " << runs << ": " << typeid(e).name() << ": " << e.what() << "\ninput: " << text);
    }
  }
  std::cout << "fuzz header: " << runs << " runs, " << parsed << " parsed" << std::endl;
  CHECK(runs > 0);
}

TEST_CASE("fuzz: mutated whole files open and read or throw tessera::Error", "[fuzz]") {
  TempDir dir;
  const auto seeds = seed_files(dir);
  const FuzzSettings s = settings("fuzz file");
  std::mt19937_64 rng(s.seed);
  const std::string path = dir.file("mutated.safetensors");
  const auto start = std::chrono::steady_clock::now();
  int64_t runs = 0, opened = 0;
  while (runs < 2000 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < s.seconds / 2) {
    const Seed& seed = seeds[rng() % seeds.size()];
    std::string bytes = seed.file;
    if (rng() % 4 == 0) {  // the length prefix or the data
      for (int e = 0; e < 2; ++e) bytes[size_t(rng() % std::min<size_t>(bytes.size(), 8))] = char(rng() % 256);
    } else {
      bytes = bytes.substr(0, 8) + mutate(bytes.substr(8), rng);
    }
    tessera::io::test::write_file_bytes(path, bytes);
    ++runs;
    try {
      const SafetensorsFile file(path);
      ++opened;
      check_consistent(file.header(), bytes.size() - 8 - file.header().header_bytes);
      for (const auto& tensor : file.header().tensors) {
        const at::Tensor t = file.read(tensor.name);
        REQUIRE(uint64_t(t.nbytes()) == tensor.bytes());
      }
    } catch (const tessera::Error& e) {
      REQUIRE_THAT(e.what(), Catch::Matchers::Contains(path));
    } catch (const std::exception& e) {
      FAIL("seed " << s.seed << " run " << runs << ": " << typeid(e).name() << ": " << e.what());
    }
  }
  std::cout << "fuzz file: " << runs << " runs, " << opened << " opened" << std::endl;
  CHECK(runs > 0);
}

}  // namespace
