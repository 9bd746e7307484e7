// Strict JSON parsing for untrusted checkpoint files: nlohmann's parser with duplicate keys and
// nesting deeper than `max_depth` refused (nlohmann silently keeps the last duplicate), and every
// nlohmann exception turned into a tessera::CheckpointError "<what>: ...".
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace tessera::io::detail {

// `max_depth` counts containers: {"a": {"shape": [1]}} has depth 3.
nlohmann::json parse_strict_json(std::string_view text, int max_depth, const std::string& what);

}  // namespace tessera::io::detail
