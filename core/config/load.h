// Loading turns a tessera TOML file or a DeepSpeed JSON file into a validated Config.
//
// Both syntaxes use DeepSpeed's key names: a TOML file is the JSON file with tables as [headers]
// (configs/zero3.toml shows one). The same decoder, key registry (keys.h) and validation
// (validate.h) serve both, so a setting means the same in either. "auto" values stay auto
// (resolve_auto.h fills them when the engine starts); keys DeepSpeed accepts but tessera ignores
// become one-line warnings in Config::warnings; keys asking for missing features are listed in
// Config::unsupported (refused by refuse_unsupported); every other problem is a ConfigError that
// lists each bad key with its path, value, what was expected, the file and the line.
//
// Example: load_config("ds_config.json") on {"zero_optimization": {"stage": 3,
// "offload_optimizer": {"device": "gpu"}}} throws
//   ds_config.json:1: zero_optimization.offload_optimizer.device: expected one of none, cpu, nvme, got "gpu" (a string)
#pragma once

#include <string>
#include <string_view>

#include "core/config/config.h"

namespace tessera::config {

enum class Format { toml, json };

// The format of a file from its extension (.toml / .json); other extensions are sniffed (a JSON
// document starts with '{').
Format format_of(const std::string& path, std::string_view text = {});

// Reads, decodes and validates a file. Throws ConfigError (with the file name) when the file
// cannot be read, does not parse, or holds invalid settings.
Config load_config(const std::string& path);

// The same for text in memory; `origin` names it in messages.
Config load_config_text(std::string_view text, Format format, const std::string& origin = "<string>");

}  // namespace tessera::config
