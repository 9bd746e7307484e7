#include "core/config/describe.h"

#include <algorithm>

#include "core/config/detail/encode.h"
#include "core/config/node.h"

namespace tessera::config {
namespace {

struct Line {
  std::string assignment;
  std::string mark;
};

void walk(const Config& config, const Node& node, const std::string& path, std::vector<Line>& out) {
  if (node.is_table() && !config.passthrough.count(path)) {
    for (const auto& [key, value] : node.fields) walk(config, value, path.empty() ? key : path + "." + key, out);
    return;
  }
  const bool refused = std::any_of(config.unsupported.begin(), config.unsupported.end(), [&](const UnsupportedKey& k) {
    return k.path == path || k.path.rfind(path + ".", 0) == 0;
  });
  std::string mark;
  if (config.passthrough.count(path)) {
    mark = refused ? "not yet supported" : "ignored";
  } else {
    const Mark m = config.provenance.get(path);
    mark = name_of(m.origin);
    if (!m.note.empty()) mark += std::string(m.origin == Origin::pending_auto ? ": waits for " : ": ") + m.note;
    if (refused) mark += "; not yet supported";
  }
  out.push_back(Line{path + " = " + to_json_text(node), mark});
}

}  // namespace

std::string describe(const Config& config) {
  std::vector<Line> lines;
  walk(config, detail::encode(config), "", lines);
  // Values the file left out that are derived once a fact is known (batch sizes without a world size).
  for (const auto& [path, mark] : config.provenance.all()) {
    if (mark.origin != Origin::pending_auto) continue;
    const std::string prefix = path + " = ";
    const bool printed = std::any_of(lines.begin(), lines.end(), [&](const Line& l) { return l.assignment.rfind(prefix, 0) == 0; });
    if (!printed) lines.push_back(Line{path + " = (not known yet)", "derived later: waits for " + mark.note});
  }
  std::size_t width = 0;
  for (const Line& line : lines) width = std::max(width, std::min<std::size_t>(line.assignment.size(), 60));
  std::string out;
  for (const Line& line : lines) {
    out += line.assignment;
    out += std::string(line.assignment.size() < width ? width - line.assignment.size() : 0, ' ');
    out += "  # " + line.mark + "\n";
  }
  return out;
}

}  // namespace tessera::config
