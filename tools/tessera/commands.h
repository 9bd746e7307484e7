// The subcommands of the `tessera` executable. Each add_* function registers one command family
// on the CLI11 app; a command reports failure by throwing CLI::RuntimeError(exit_code).
#pragma once

namespace CLI {
class App;
}

namespace tessera::cli {

void add_doctor_command(CLI::App& app);   // tessera doctor
void add_config_commands(CLI::App& app);  // tessera config check|convert|new
void add_config_new_command(CLI::App& config);  // tessera config new (on the `config` subcommand)
void add_affine_commands(CLI::App& app);  // tessera affine plan|check
void add_checkpoint_commands(CLI::App& app);  // tessera checkpoint inspect|verify|consolidate

}  // namespace tessera::cli
