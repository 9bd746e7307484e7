// A Node is one value of a parsed configuration document, independent of its syntax.
//
// TOML and JSON files are both parsed into this one tree, so that decoding, key checking,
// validation and writing exist once, not once per syntax: toml++ and nlohmann_json are used only
// in load.cpp (text -> Node); write.cpp spells both syntaxes itself. No public header includes them.
//
// Invariants: a table keeps its keys in file order (so a written file reads like its source);
// `line` is the 1-based line of the value (for a table entry, of its key); 0 = made in memory.
// Integers and floats stay distinct, as the file wrote them: `2e8` is a float whose value is
// integral, which the decoder accepts where an integer is expected.
//
// Example: the JSON text {"zero_optimization": {"stage": 3, "sub_group_size": 1e9}} is
//   table{ "zero_optimization": table{ "stage": integer 3, "sub_group_size": floating 1e9 } }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::config {

struct Node {
  enum class Kind { null, boolean, integer, floating, string, array, table };

  Kind kind = Kind::null;
  bool boolean = false;
  std::int64_t integer = 0;
  double floating = 0.0;
  std::string string;
  std::vector<Node> items;                             // Kind::array
  std::vector<std::pair<std::string, Node>> fields;    // Kind::table, in file order
  int line = 0;                                        // 1-based line in its file; 0 = unknown

  static Node make_table() { Node n; n.kind = Kind::table; return n; }
  static Node make_array() { Node n; n.kind = Kind::array; return n; }
  static Node of(bool v) { Node n; n.kind = Kind::boolean; n.boolean = v; return n; }
  static Node of(std::int64_t v) { Node n; n.kind = Kind::integer; n.integer = v; return n; }
  static Node of(double v) { Node n; n.kind = Kind::floating; n.floating = v; return n; }
  static Node of(std::string v) { Node n; n.kind = Kind::string; n.string = std::move(v); return n; }

  bool is_table() const { return kind == Kind::table; }
  bool is_auto() const { return kind == Kind::string && string == "auto"; }

  // The value under `key` in a table, or nullptr.
  const Node* find(std::string_view key) const;
  Node* find(std::string_view key);
  // Sets `key` in a table, replacing an existing value (keeps its position) or appending.
  Node& set(const std::string& key, Node value);
  // The table at a dotted path below this table, created on the way when missing.
  Node& table_at(std::string_view dotted_path);
};

// The value as a user would type it in JSON: 3, 2e+08, "cpu", [2, -1], {...}.
std::string to_json_text(const Node& node);
// The kind in words, for error messages: "a string", "an integer", "a table", ...
std::string kind_name(const Node& node);

// Parsing (load.cpp). Syntax errors throw ConfigError naming `origin` (and line/column).
Node parse_toml_text(std::string_view text, const std::string& origin);
Node parse_json_text(std::string_view text, const std::string& origin);

// Writing (write.cpp). A table is written with its keys in order; TOML output puts scalar keys
// first and sub-tables as [a.b] headers; JSON is indented by 2. Null values are left out of
// TOML, which has no null.
std::string emit_toml(const Node& root);
std::string emit_json(const Node& root);

}  // namespace tessera::config
