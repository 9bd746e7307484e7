#include "core/log/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"

namespace tessera::log {
namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

// One logger per process, made at first use (thread-safe: a function-local static). Unbuffered
// stderr with a flush per line, so a line is out before a crash or an abort that follows it.
spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = [] {
    auto l = std::make_shared<spdlog::logger>("tessera", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("[tessera] %l: %v");
    const char* env = std::getenv("TESSERA_LOG_LEVEL");
    l->set_level(to_spdlog(env && *env ? parse_level(env) : Level::info));
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *instance;
}

}  // namespace

Level parse_level(std::string_view name) {
  if (name == "trace") return Level::trace;
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warning" || name == "warn") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  throw ConfigError("TESSERA_LOG_LEVEL: '" + std::string(name) +
                    "' is not one of trace, debug, info, warning, error, off");
}

bool enabled(Level level) { return logger().should_log(to_spdlog(level)); }

void debug(std::string_view message) { logger().debug("{}", message); }
void info(std::string_view message) { logger().info("{}", message); }
void warn(std::string_view message) { logger().warn("{}", message); }
void error(std::string_view message) { logger().error("{}", message); }

}  // namespace tessera::log
