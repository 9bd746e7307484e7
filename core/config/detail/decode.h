// Decoding: a parsed document (Node) -> Config, with key checking (keys.h). Both syntaxes go
// through here, so TOML and DeepSpeed JSON get the same keys, defaults and error messages.
#pragma once

#include "core/config/config.h"
#include "core/config/detail/errors.h"
#include "core/config/node.h"

namespace tessera::config::detail {

// Fills `out` (which starts as a default Config) from `root`; problems go to `errors`, warnings
// and not-yet-supported keys to out.warnings / out.unsupported.
void decode(const Node& root, Config& out, ErrorList& errors);

}  // namespace tessera::config::detail
