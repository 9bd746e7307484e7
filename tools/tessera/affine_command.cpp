// `tessera affine plan|check` (being built for issue 3 in core/affine).
#include <CLI/CLI.hpp>

#include "tools/tessera/commands.h"

namespace tessera::cli {
void add_affine_commands(CLI::App& app) {
  app.add_subcommand("affine", "Plan transfers between affine maps and check maps");
}
}  // namespace tessera::cli
