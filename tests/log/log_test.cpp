// tessera's log lines: the format on stderr (read back from the file descriptor itself, not from a
// mock sink), the threshold TESSERA_LOG_LEVEL sets (ctest runs the "[error-level]" case with it set
// to error), and the refusal of an unknown level name.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/log/log.h"

namespace {

// What `emit` writes to file descriptor 2 (through a temporary file put in its place).
template <class Emit>
std::string captured_stderr(Emit&& emit) {
  char path[] = "/tmp/tessera_log_test_XXXXXX";
  const int file = ::mkstemp(path);
  REQUIRE(file >= 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(file, 2);
  emit();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  return text.str();
}

}  // namespace

TEST_CASE("log lines are '[tessera] <level>: <message>' on stderr; debug is below the default", "[log][default]") {
  const auto text = captured_stderr([] {
    tessera::log::warn("config: key 'x' is ignored");
    tessera::log::info("an info line");
    tessera::log::debug("not shown");
  });
  CHECK(text == "[tessera] warning: config: key 'x' is ignored\n[tessera] info: an info line\n");
  CHECK(tessera::log::enabled(tessera::log::Level::info));
  CHECK_FALSE(tessera::log::enabled(tessera::log::Level::debug));
}

TEST_CASE("TESSERA_LOG_LEVEL=error keeps warnings out", "[log][error-level]") {
  const auto text = captured_stderr([] {
    tessera::log::warn("hidden");
    tessera::log::error("shown");
  });
  CHECK(text == "[tessera] error: shown\n");
}

TEST_CASE("level names: DeepSpeed's and spdlog's spellings; an unknown one is refused by name", "[log][default]") {
  CHECK(tessera::log::parse_level("warning") == tessera::log::Level::warn);
  CHECK(tessera::log::parse_level("warn") == tessera::log::Level::warn);
  CHECK(tessera::log::parse_level("off") == tessera::log::Level::off);
  CHECK_THROWS_AS(tessera::log::parse_level("loud"), tessera::ConfigError);
  CHECK_THROWS_WITH(tessera::log::parse_level("loud"), Catch::Contains("TESSERA_LOG_LEVEL") && Catch::Contains("'loud'"));
}
