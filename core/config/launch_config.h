// The config a launcher hands every rank: `tessera-launch --config_file accelerate.yaml` turns an
// Accelerate file into a DeepSpeed-style config (tools/tessera_launch/accelerate_config.py) and puts
// it in the environment: TESSERA_LAUNCH_CONFIG_JSON (the JSON text), TESSERA_LAUNCH_CONFIG_ORIGIN (what
// it came from, for messages), TESSERA_LAUNCH_DS_FIELDS (the plugin variables the file set) and
// TESSERA_ZERO3_INIT (zero3_init_flag), read once by launch_config_from_env(). A program asks
// program_config(path, launch_config_from_env()) for its config.
//
// A program may bring a config of its own as well (HF-style scripts fill the launcher's "auto" batch
// sizes and pass it back; others ship an all-"auto" JSON). Then each plugin variable the Accelerate
// file set fills the program's value where the program wrote "auto" or left the key out, and a value
// the program wrote must equal the file's: a difference is refused, naming both, because one of them
// would be ignored.
//
// Example: under `tessera-launch --config_file acc.yaml train_lm` (zero_stage: 3), train_lm without
// --config runs with zero_optimization.stage 3; with --config ds.json whose stage is "auto", stage 3;
// with one whose stage is 2, a ConfigError: "zero_optimization.stage is 2 in ds.json but 3 in acc.yaml".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace tessera::config {

struct LaunchConfig {
  std::string json;                         // the text as handed over
  Config config;                            // loaded and validated; "auto" values stay auto
  std::string origin;                       // e.g. "acc.yaml (Accelerate's DeepSpeed plugin)"
  std::vector<std::string> plugin_fields;   // e.g. {"zero_stage", "gradient_clipping"}
  bool zero3_init = false;                  // construct the model partitioned (zero3_init_flag)
};

// The launcher's config, or nothing when the launcher gave none. Invalid JSON or settings are a
// ConfigError naming the origin.
std::optional<LaunchConfig> launch_config_from_env();

// `config` (the program's own) with the launcher's plugin variables applied as above. Throws
// ConfigError listing every contradiction.
Config reconcile_with_launch(Config config, const LaunchConfig& launched);

// The config a program runs with: `path` (a TOML/JSON file) reconciled with `launched` when both are
// given; else the launcher's; else a ConfigError saying neither was given (`who` names the option).
Config program_config(const std::string& path, const std::optional<LaunchConfig>& launched,
                      const std::string& who = "--config");

}  // namespace tessera::config
