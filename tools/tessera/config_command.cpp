// `tessera config check|convert` (being built for issue 2 in core/config).
#include <CLI/CLI.hpp>

#include "tools/tessera/commands.h"

namespace tessera::cli {
void add_config_commands(CLI::App& app) {
  app.add_subcommand("config", "Validate and convert tessera TOML / DeepSpeed JSON configurations");
}
}  // namespace tessera::cli
