// Node -> text for both syntaxes, and Config -> text through the encoder.
#include "core/config/write.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

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
      std::string text = to_json_text(n);
      if (text.find_first_of(".eE") == std::string::npos) text += ".0";
      return text;
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

nlohmann::ordered_json to_nlohmann(const Node& n) {
  switch (n.kind) {
    case Node::Kind::null: return nullptr;
    case Node::Kind::boolean: return n.boolean;
    case Node::Kind::integer: return n.integer;
    case Node::Kind::floating: return n.floating;
    case Node::Kind::string: return n.string;
    case Node::Kind::array: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Node& item : n.items) a.push_back(to_nlohmann(item));
      return a;
    }
    case Node::Kind::table: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [key, value] : n.fields) o[key] = to_nlohmann(value);
      return o;
    }
  }
  return nullptr;
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

std::string emit_json(const Node& root) { return to_nlohmann(root).dump(2) + "\n"; }

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
