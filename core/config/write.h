// Writing turns a Config back into a tessera TOML file or a DeepSpeed JSON file that loads into an
// equal Config (operator==): every modelled value is written, defaults included, "auto" values as
// "auto", and the keys tessera passes through (ignored or not yet supported) at their place.
//
// Example: to_json(load_config("configs/zero3.toml")) is a DeepSpeed JSON file with
// "zero_optimization": {"stage": 3, ...} and a "tessera" section, and
// load_config_text(to_json(c), Format::json) == c for every loaded c.
#pragma once

#include <string>

#include "core/config/config.h"
#include "core/config/load.h"

namespace tessera::config {

std::string to_toml(const Config& config);
std::string to_json(const Config& config);
std::string to_text(const Config& config, Format format);

}  // namespace tessera::config
