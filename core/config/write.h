// Writing turns a Config back into a tessera TOML file or a DeepSpeed JSON file that loads into an
// equal Config (operator==). "auto" values are written as "auto", the keys tessera passes through
// (ignored or not yet supported) at their place. By default a value is left out when it equals
// DeepSpeed's default and the source did not write it, so a converted file stays as short as its
// source and DeepSpeed reads it without meeting tessera's defaults for keys it lacks (an empty
// "tessera" section is left out too); include_defaults writes every value.
//
// Example: to_json(load_config("configs/zero2.toml")) is
//   {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 4,
//    "gradient_clipping": 1.0, "bf16": {"enabled": true}, "optimizer": {...}, "zero_optimization": {"stage": 2, ...}}
// and load_config_text(to_json(c), Format::json) == c for every loaded c.
#pragma once

#include <string>

#include "core/config/config.h"
#include "core/config/load.h"

namespace tessera::config {

struct WriteOptions {
  bool include_defaults = false;  // also write values that are DeepSpeed's defaults
};

std::string to_toml(const Config& config, const WriteOptions& options = {});
std::string to_json(const Config& config, const WriteOptions& options = {});
std::string to_text(const Config& config, Format format, const WriteOptions& options = {});

}  // namespace tessera::config
