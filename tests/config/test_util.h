// Helpers shared by the configuration tests.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "core/config/load.h"
#include "core/error.h"

namespace tessera::config::test {

inline std::string source_path(const std::string& relative) { return std::string(TESSERA_SOURCE_DIR) + "/" + relative; }

inline Config load_json(const std::string& text, const std::string& origin = "test.json") {
  return load_config_text(text, Format::json, origin);
}
inline Config load_toml(const std::string& text, const std::string& origin = "test.toml") {
  return load_config_text(text, Format::toml, origin);
}

// The message of the ConfigError `f` throws; fails the test when it throws nothing.
template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return {};
}

}  // namespace tessera::config::test
