// tessera's log: what the runtime itself reports while it runs (config warnings, skipped fp16
// steps, a ZeRO-3 window leaving the recorded order), one line each on stderr as
// "[tessera] <level>: <message>", through spdlog (kept out of this header, so it costs includers
// nothing). TESSERA_LOG_LEVEL (trace, debug, info, warning, error, off; default info) sets the
// threshold once per process; tessera-launch prefixes each line with the rank.
//
// Example: tessera::log::warn("config: key 'x' is ignored") prints
//   [tessera] warning: config: key 'x' is ignored
#pragma once

#include <string_view>

namespace tessera::log {

enum class Level { trace, debug, info, warn, error, off };

void debug(std::string_view message);
void info(std::string_view message);
void warn(std::string_view message);
void error(std::string_view message);
// Whether a message at `level` is printed (to skip building a costly one).
bool enabled(Level level);
// The threshold TESSERA_LOG_LEVEL names; an unknown name is refused (tessera::ConfigError naming it).
Level parse_level(std::string_view name);

}  // namespace tessera::log
