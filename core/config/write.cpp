// Node -> text for both syntaxes (no parser library needed), and Config -> text through the encoder.
#include "core/config/write.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>

#include "core/config/detail/encode.h"
#include "core/config/node.h"

namespace tessera::config {
namespace {

bool is_bare_key(const std::string& key) {
  if (key.empty()) return false;
  for (char c : key) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

std::string toml_key(const std::string& key) { return is_bare_key(key) ? key : to_json_text(Node::of(key)); }

std::string toml_value(const Node& n) {
  switch (n.kind) {
    case Node::Kind::floating: {
      if (std::isnan(n.floating)) return "nan";
      if (std::isinf(n.floating)) return n.floating > 0 ? "inf" : "-inf";
      return to_json_text(n);  // always with a '.' or an exponent
    }
    case Node::Kind::array: {
      std::string out = "[";
      bool first = true;
      for (const Node& item : n.items) {
        if (item.kind == Node::Kind::null) continue;
        out += first ? "" : ", ";
        out += toml_value(item);
        first = false;
      }
      return out + "]";
    }
    case Node::Kind::table: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : n.fields) {
        if (value.kind == Node::Kind::null) continue;
        out += first ? " " : ", ";
        out += toml_key(key) + " = " + toml_value(value);
        first = false;
      }
      return out + (first ? "}" : " }");
    }
    default:
      return to_json_text(n);  // booleans, integers and strings are spelled alike
  }
}

void emit_table(std::string& out, const Node& table, const std::string& header) {
  bool has_scalars = false;
  for (const auto& [key, value] : table.fields) {
    if (value.kind == Node::Kind::null || value.is_table()) continue;
    has_scalars = true;
  }
  if (!header.empty() && (has_scalars || table.fields.empty())) {
    out += (out.empty() ? "" : "\n") + std::string("[") + header + "]\n";
  }
  for (const auto& [key, value] : table.fields) {
    if (value.kind == Node::Kind::null || value.is_table()) continue;
    out += toml_key(key) + " = " + toml_value(value) + "\n";
  }
  for (const auto& [key, value] : table.fields) {
    if (!value.is_table()) continue;
    emit_table(out, value, header.empty() ? toml_key(key) : header + "." + toml_key(key));
  }
}

// Tables one key per line, indented by 2; lists of scalars on one line, as people write them.
void emit_json_value(std::string& out, const Node& n, int indent) {
  // Inline: scalars, and lists of scalars (a shape such as [[4096, 1024, 1024], -1]).
  const auto is_scalar = [](const Node& item) {
    if (item.is_table()) return false;
    if (item.kind != Node::Kind::array) return true;
    return std::none_of(item.items.begin(), item.items.end(),
                        [](const Node& x) { return x.is_table() || x.kind == Node::Kind::array; });
  };
  if (n.is_table() && !n.fields.empty()) {
    out += "{\n";
    for (std::size_t i = 0; i < n.fields.size(); ++i) {
      out += std::string(indent + 2, ' ') + to_json_text(Node::of(n.fields[i].first)) + ": ";
      emit_json_value(out, n.fields[i].second, indent + 2);
      out += i + 1 < n.fields.size() ? ",\n" : "\n";
    }
    out += std::string(indent, ' ') + "}";
  } else if (n.kind == Node::Kind::array && !std::all_of(n.items.begin(), n.items.end(), is_scalar)) {
    out += "[\n";
    for (std::size_t i = 0; i < n.items.size(); ++i) {
      out += std::string(indent + 2, ' ');
      emit_json_value(out, n.items[i], indent + 2);
      out += i + 1 < n.items.size() ? ",\n" : "\n";
    }
    out += std::string(indent, ' ') + "]";
  } else {
    out += to_json_text(n);
  }
}

bool same_value(const Node& a, const Node& b) { return to_json_text(a) == to_json_text(b); }

// Removes the values of `node` that equal `defaults` and were not given; returns whether the
// table ended up empty (and was not itself given).
bool prune(Node& node, const Node& defaults, const std::string& path, const Config& config) {
  auto& fields = node.fields;
  for (auto it = fields.begin(); it != fields.end();) {
    const std::string key_path = path.empty() ? it->first : path + "." + it->first;
    const Node* fallback = defaults.find(it->first);
    const bool given = config.provenance.get(key_path).origin == Origin::given || config.passthrough.count(key_path);
    bool drop = false;
    if (it->second.kind == Node::Kind::array) {
      // Layer specs: leave out their empty lists (no shape, every model type).
      for (Node& item : it->second.items) {
        if (!item.is_table()) continue;
        auto& f = item.fields;
        f.erase(std::remove_if(f.begin(), f.end(),
                               [](const auto& kv) { return kv.second.kind == Node::Kind::array && kv.second.items.empty(); }),
                f.end());
      }
    }
    if (!given && fallback != nullptr) {
      if (it->second.is_table() && fallback->is_table()) {
        drop = prune(it->second, *fallback, key_path, config);
      } else {
        drop = same_value(it->second, *fallback);
      }
    }
    it = drop ? fields.erase(it) : it + 1;
  }
  return fields.empty();
}

Node encode_for_writing(const Config& config, const WriteOptions& options) {
  Node root = detail::encode(config);
  if (options.include_defaults) return root;
  Config defaults;
  if (config.optimizer) defaults.optimizer = OptimizerConfig{}, defaults.optimizer->type = config.optimizer->type;
  if (config.scheduler) defaults.scheduler = SchedulerConfig{}, defaults.scheduler->type = config.scheduler->type;
  prune(root, detail::encode(defaults), "", config);
  return root;
}

}  // namespace

std::string emit_toml(const Node& root) {
  std::string out;
  emit_table(out, root, "");
  return out;
}

std::string emit_json(const Node& root) {
  std::string out;
  emit_json_value(out, root, 0);
  return out + "\n";
}

std::string to_toml(const Config& config, const WriteOptions& options) {
  return "# tessera configuration" + (config.source.empty() ? std::string() : " converted from " + config.source) +
         "\n" + emit_toml(encode_for_writing(config, options));
}

std::string to_json(const Config& config, const WriteOptions& options) {
  return emit_json(encode_for_writing(config, options));
}

std::string to_text(const Config& config, Format format, const WriteOptions& options) {
  return format == Format::toml ? to_toml(config, options) : to_json(config, options);
}

}  // namespace tessera::config
