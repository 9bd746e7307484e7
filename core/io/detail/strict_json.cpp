#include "core/io/detail/strict_json.h"

#include <set>
#include <vector>

#include "core/error.h"

namespace tessera::io::detail {
namespace {

struct Refused {
  std::string why;
};

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, int max_depth, const std::string& what) {
  using nlohmann::json;
  // One key set per open container (arrays get an unused one), so duplicates are found per object.
  std::vector<std::set<std::string>> open;
  auto check = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        open.emplace_back();
        if (int(open.size()) > max_depth)
          throw Refused{"nested deeper than " + std::to_string(max_depth) + " levels"};
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open.empty() && !open.back().insert(parsed.get<std::string>()).second)
          throw Refused{"duplicate key \"" + parsed.get<std::string>() + "\""};
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.data(), text.data() + text.size(), check);
  } catch (const Refused& refused) {
    throw CheckpointError(what + ": " + refused.why);
  } catch (const json::exception& e) {
    throw CheckpointError(what + ": not valid JSON: " + e.what());
  }
}

}  // namespace tessera::io::detail
