#include "core/config/node.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace tessera::config {

const Node* Node::find(std::string_view key) const {
  for (const auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

Node* Node::find(std::string_view key) {
  for (auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

Node& Node::set(const std::string& key, Node value) {
  kind = Kind::table;
  if (Node* existing = find(key)) return *existing = std::move(value);
  fields.emplace_back(key, std::move(value));
  return fields.back().second;
}

Node& Node::table_at(std::string_view dotted_path) {
  Node* table = this;
  while (!dotted_path.empty()) {
    const std::size_t dot = dotted_path.find('.');
    const std::string key(dotted_path.substr(0, dot));
    dotted_path = dot == std::string_view::npos ? std::string_view() : dotted_path.substr(dot + 1);
    Node* next = table->find(key);
    if (next == nullptr || !next->is_table()) next = &table->set(key, make_table());
    table = next;
  }
  return *table;
}

namespace {
void append_quoted(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_json(std::string& out, const Node& n) {
  switch (n.kind) {
    case Node::Kind::null: out += "null"; break;
    case Node::Kind::boolean: out += n.boolean ? "true" : "false"; break;
    case Node::Kind::integer: out += std::to_string(n.integer); break;
    case Node::Kind::floating: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", n.floating);
      // Prefer the shortest text that reads back as the same double.
      for (int precision = 1; precision <= 17; ++precision) {
        char shorter[32];
        std::snprintf(shorter, sizeof shorter, "%.*g", precision, n.floating);
        if (std::strtod(shorter, nullptr) == n.floating) {
          std::snprintf(buf, sizeof buf, "%s", shorter);
          break;
        }
      }
      out += buf;
      // Keep a float a float when read back: 1.0, not 1 (nan/inf have no JSON spelling anyway).
      if (std::isfinite(n.floating) && std::string_view(buf).find_first_of(".eE") == std::string_view::npos) out += ".0";
      break;
    }
    case Node::Kind::string: append_quoted(out, n.string); break;
    case Node::Kind::array: {
      out += '[';
      for (std::size_t i = 0; i < n.items.size(); ++i) {
        if (i) out += ", ";
        append_json(out, n.items[i]);
      }
      out += ']';
      break;
    }
    case Node::Kind::table: {
      out += '{';
      for (std::size_t i = 0; i < n.fields.size(); ++i) {
        if (i) out += ", ";
        append_quoted(out, n.fields[i].first);
        out += ": ";
        append_json(out, n.fields[i].second);
      }
      out += '}';
      break;
    }
  }
}
}  // namespace

std::string to_json_text(const Node& node) {
  std::string out;
  append_json(out, node);
  return out;
}

std::string kind_name(const Node& node) {
  switch (node.kind) {
    case Node::Kind::null: return "null";
    case Node::Kind::boolean: return "a boolean";
    case Node::Kind::integer: return "an integer";
    case Node::Kind::floating: return "a number";
    case Node::Kind::string: return "a string";
    case Node::Kind::array: return "a list";
    case Node::Kind::table: return "a table";
  }
  return "a value";
}

}  // namespace tessera::config
