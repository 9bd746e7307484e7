// Encoding: Config -> Node, every modelled value written out (defaults included, "auto" as the
// string "auto"), then the pass-through keys at their paths. write.h turns the Node into text;
// `tessera config check` walks it to print each value with its provenance.
#pragma once

#include "core/config/config.h"
#include "core/config/node.h"

namespace tessera::config::detail {

Node encode(const Config& config);

}  // namespace tessera::config::detail
