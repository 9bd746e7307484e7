// Uses the installed headers and libraries of tessera: the error hierarchy, a configuration
// loaded from TOML text, and an affine plan; prints "consumer ok <version>" on success.
#include <tessera/core/affine/builders.h>
#include <tessera/core/affine/planner.h>
#include <tessera/core/config/load.h>
#include <tessera/core/error.h>
#include <tessera/core/version.h>

#include <iostream>

int main() {
  try {
    tessera::config::load_config_text("[zero_optimization]\nstagee = 2\n", tessera::config::Format::toml, "c.toml");
    return 1;  // a typo must be refused
  } catch (const tessera::ConfigError& e) {
    if (std::string(e.what()).find("stage") == std::string::npos) return 2;
  }
  auto config = tessera::config::load_config_text("[zero_optimization]\nstage = 2\n", tessera::config::Format::toml,
                                                  "c.toml");
  if (config.zero_optimization.stage.value != 2) return 3;
  tessera::affine::TensorInfo w{"w", tessera::affine::DType::f32, tessera::affine::Dims{8, 6}};
  auto rows = tessera::affine::contiguous_split(w, 0, {4, 4});
  auto cols = tessera::affine::contiguous_split(w, 1, {2, 2, 2});
  auto plan = tessera::affine::plan(cols, rows);
  if (plan.segments.empty()) return 4;
  std::cout << "consumer ok " << TESSERA_VERSION_STRING << " (" << plan.segments.size() << " segments)\n";
  return 0;
}
