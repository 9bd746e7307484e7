// `tessera`: the command-line entry point (doctor, config, affine, checkpoint).
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "core/error.h"
#include "core/version.h"
#include "tools/tessera/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: ZeRO-sharded training of LibTorch models, with exact weight transfer to rollout engines"};
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION_STRING);
  app.require_subcommand(1);
  tessera::cli::add_doctor_command(app);
  tessera::cli::add_config_commands(app);
  tessera::cli::add_affine_commands(app);
  tessera::cli::add_checkpoint_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tessera::Error& e) {
    std::cerr << "tessera: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tessera: unexpected error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
