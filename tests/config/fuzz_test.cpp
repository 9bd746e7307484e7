// Random mutations of every shipped configuration through load_config_text: whatever the bytes,
// loading either succeeds or throws a tessera::Error (ConfigError with the file), never another
// exception type and never a crash. Bounded in time (TESSERA_FUZZ_SECONDS, default 3 per syntax);
// the seed is printed and TESSERA_FUZZ_SEED replays it.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/load.h"
#include "core/error.h"
#include "tests/config/test_util.h"

namespace {

namespace cfg = tessera::config;

std::vector<std::string> read_all(const std::string& folder, const std::string& extension) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(tessera::config::test::source_path(folder))) {
    if (entry.path().extension() != extension) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    out.push_back(text.str());
  }
  std::sort(out.begin(), out.end());  // directory order is not stable
  return out;
}

// One mutation: the kinds that found bugs by hand (numbers out of range, cut strings, swapped
// brackets, duplicated lines) plus plain byte noise.
std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::vector<std::string> tokens = {"\"auto\"", "1e999", "-1", "2e88739", "18446744073709551616",
                                                  "-9223372036854775809", "nan", "inf", "null", "[]", "{}", "\"\"",
                                                  "true", "0.5", "\"\\u0000\"", "\xff\xfe", "=", ":", ",", "[[x]]"};
  auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
  const int edits = 1 + int(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = pick(text.size() + 1);
    switch (rng() % 7) {
      case 0: if (!text.empty()) text[pick(text.size())] = char(rng() % 256); break;
      case 1: text.insert(at, tokens[pick(tokens.size())]); break;
      case 2: text.erase(at, pick(16)); break;
      case 3: text.insert(at, text.substr(pick(text.size()), pick(64))); break;
      case 4: {  // replace a number by an out-of-range one
        const size_t digit = text.find_first_of("0123456789", at);
        if (digit != std::string::npos) text.insert(digit + 1, "e" + std::to_string(300 + rng() % 100000));
        break;
      }
      case 5: text = text.substr(0, at); break;
      default: {
        const size_t line = text.find('\n', at);
        if (line != std::string::npos) text.insert(line + 1, text.substr(at, line - at + 1));
      }
    }
  }
  return text;
}

void fuzz(const std::vector<std::string>& seeds, cfg::Format format, const char* origin) {
  REQUIRE_FALSE(seeds.empty());
  const char* replay = std::getenv("TESSERA_FUZZ_SEED");
  const uint64_t seed = replay ? std::strtoull(replay, nullptr, 10) : std::random_device{}();
  const char* limit = std::getenv("TESSERA_FUZZ_SECONDS");
  const double seconds = limit ? std::atof(limit) : 3.0;
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  int64_t runs = 0, loaded = 0, refused = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    const std::string text = mutate(seeds[rng() % seeds.size()], rng);
    ++runs;
    try {
      cfg::load_config_text(text, format, origin);
      ++loaded;
    } catch (const tessera::ConfigError& e) {
      ++refused;
      // Every refusal names the file it is about.
      if (std::string(e.what()).find(origin) == std::string::npos) FAIL_CHECK("no file named: " << e.what());
    } catch (const std::exception& e) {
      FAIL("TESSERA_FUZZ_SEED=" << seed << " run " << runs << ": " << typeid(e).name() << ": " << e.what()
                                << "\n--- input ---\n" << text);
    }
  }
  WARN(origin << ": seed " << seed << ", " << runs << " mutations: " << loaded << " loaded, " << refused << " refused");
  CHECK(runs > 100);
  CHECK(refused > 0);
}

}  // namespace

TEST_CASE("Mutated DeepSpeed JSON configs raise only tessera errors", "[config][fuzz]") {
  fuzz(read_all("configs/deepspeed", ".json"), cfg::Format::json, "fuzz.json");
}

TEST_CASE("Mutated TOML configs raise only tessera errors", "[config][fuzz]") {
  fuzz(read_all("configs", ".toml"), cfg::Format::toml, "fuzz.toml");
}

TEST_CASE("A number too large for a double is a ConfigError with the file and line", "[config][fuzz]") {
  const std::string text = "{\n  \"zero_optimization\": {\n    \"reduce_bucket_size\": 2e88739\n  }\n}\n";
  const auto message = tessera::config::test::config_error([&] { cfg::load_config_text(text, cfg::Format::json, "big.json"); });
  CHECK_THAT(message, Catch::Contains("big.json:3"));
  CHECK_THAT(message, Catch::Contains("2e88739"));
}
