// Text -> Node for both syntaxes (the only file that includes toml++ and nlohmann_json's parser),
// then decode and validate.
#include "core/config/load.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "core/config/detail/decode.h"
#include "core/config/node.h"
#include "core/config/validate.h"
#include "core/error.h"
#include "core/text.h"

namespace tessera::config {
namespace {

Node from_toml(const toml::node& source, const std::string& origin) {
  Node out;
  out.line = static_cast<int>(source.source().begin.line);
  if (const auto* table = source.as_table()) {
    out.kind = Node::Kind::table;
    std::vector<std::pair<toml::source_position, std::pair<std::string, Node>>> ordered;
    for (const auto& [key, value] : *table) {
      ordered.push_back({value.source().begin, {std::string(key.str()), from_toml(value, origin)}});
    }
    // toml++ keeps keys sorted; a written file reads best in its own order.
    std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& entry : ordered) out.fields.push_back(std::move(entry.second));
  } else if (const auto* array = source.as_array()) {
    out.kind = Node::Kind::array;
    for (const auto& item : *array) out.items.push_back(from_toml(item, origin));
  } else if (const auto* s = source.as_string()) {
    out.kind = Node::Kind::string;
    out.string = s->get();
  } else if (const auto* i = source.as_integer()) {
    out.kind = Node::Kind::integer;
    out.integer = i->get();
  } else if (const auto* f = source.as_floating_point()) {
    out.kind = Node::Kind::floating;
    out.floating = f->get();
  } else if (const auto* b = source.as_boolean()) {
    out.kind = Node::Kind::boolean;
    out.boolean = b->get();
  } else {
    throw ConfigError(origin + ":" + std::to_string(out.line) +
                      ": dates and times are not configuration values; write a string or a number");
  }
  return out;
}

Node from_json(const nlohmann::ordered_json& j) {
  Node out;
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      out.kind = Node::Kind::table;
      for (const auto& [key, value] : j.items()) out.fields.emplace_back(key, from_json(value));
      break;
    case nlohmann::json::value_t::array:
      out.kind = Node::Kind::array;
      for (const auto& item : j) out.items.push_back(from_json(item));
      break;
    case nlohmann::json::value_t::string:
      out.kind = Node::Kind::string;
      out.string = j.get<std::string>();
      break;
    case nlohmann::json::value_t::boolean:
      out.kind = Node::Kind::boolean;
      out.boolean = j.get<bool>();
      break;
    case nlohmann::json::value_t::number_integer:
      out.kind = Node::Kind::integer;
      out.integer = j.get<std::int64_t>();
      break;
    case nlohmann::json::value_t::number_unsigned:
      if (j.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
        out.kind = Node::Kind::integer;
        out.integer = static_cast<std::int64_t>(j.get<std::uint64_t>());
      } else {
        out.kind = Node::Kind::floating;
        out.floating = static_cast<double>(j.get<std::uint64_t>());
      }
      break;
    case nlohmann::json::value_t::number_float:
      out.kind = Node::Kind::floating;
      out.floating = j.get<double>();
      break;
    default:
      break;  // null (and discarded) stay null
  }
  return out;
}

// nlohmann_json keeps no positions, so a second pass over the (already valid) text gives every
// value the line of its key, or of itself inside a list. Keys come in file order in both, and
// duplicates were refused, so the k-th key of an object is the k-th field of its Node.
class JsonLines {
 public:
  explicit JsonLines(std::string_view text) : text_(text) {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;  // byte order mark
  }

  void assign(Node& node) {
    skip_space();
    if (node.line == 0) node.line = line_;
    if (pos_ >= text_.size()) return;
    const char c = text_[pos_];
    if (c == '{') {
      ++pos_;
      for (std::size_t k = 0;; ++k) {
        skip_space();
        if (text_[pos_] == '}') break;
        const int key_line = line_;
        skip_string();
        skip_space();
        ++pos_;  // ':'
        Node ignored;
        Node& value = k < node.fields.size() ? node.fields[k].second : ignored;
        value.line = key_line;
        assign(value);
        skip_space();
        if (text_[pos_] == ',') ++pos_;
      }
      ++pos_;
    } else if (c == '[') {
      ++pos_;
      for (std::size_t k = 0;; ++k) {
        skip_space();
        if (text_[pos_] == ']') break;
        Node ignored;
        assign(k < node.items.size() ? node.items[k] : ignored);
        skip_space();
        if (text_[pos_] == ',') ++pos_;
      }
      ++pos_;
    } else if (c == '"') {
      skip_string();
    } else {
      while (pos_ < text_.size() && std::string_view(",]} \t\r\n").find(text_[pos_]) == std::string_view::npos) ++pos_;
    }
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r' || text_[pos_] == '\n')) {
      if (text_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }
  void skip_string() {
    ++pos_;
    while (pos_ < text_.size() && text_[pos_] != '"') pos_ += text_[pos_] == '\\' ? 2 : 1;
    ++pos_;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  int line_ = 1;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read the configuration file (does it exist?)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// ":<line>" of a JSON error: the parser's byte position for syntax errors; for a number that
// overflows, the line of the first occurrence of the quoted token. "" when unknown.
std::string json_error_line(std::string_view text, const nlohmann::json::exception& e) {
  std::size_t at = std::string_view::npos;
  if (const auto* parse = dynamic_cast<const nlohmann::json::parse_error*>(&e)) {
    at = parse->byte > 0 ? parse->byte - 1 : 0;
  } else {
    const std::string what = e.what();
    const std::size_t open = what.find('\''), close = what.rfind('\'');
    if (open != std::string::npos && close > open + 1) at = text.find(what.substr(open + 1, close - open - 1));
  }
  if (at == std::string_view::npos || at > text.size()) return "";
  return ":" + std::to_string(1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
}

}  // namespace

Node parse_toml_text(std::string_view text, const std::string& origin) {
  try {
    toml::table table = toml::parse(text, origin);
    return from_toml(table, origin);
  } catch (const toml::parse_error& e) {
    throw ConfigError(origin + ":" + std::to_string(e.source().begin.line) + ": TOML syntax error: " +
                      std::string(e.description()));
  }
}

Node parse_json_text(std::string_view text, const std::string& origin) {
  // DeepSpeed refuses duplicate keys (its loader's object_pairs_hook); so does tessera.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json& parsed) {
    using E = nlohmann::ordered_json::parse_event_t;
    if (event == E::object_start) open_objects.emplace_back();
    if (event == E::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == E::key && !open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    // parse_error (syntax) and out_of_range (a number too large for a double or an integer,
    // "2e88739"): both are the file's fault, reported with the line where it happens.
    std::string what = e.what();
    const std::size_t bracket = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) what = what.substr(bracket + 2);
    throw ConfigError(origin + json_error_line(text, e) + ": JSON " +
                      (dynamic_cast<const nlohmann::json::parse_error*>(&e) ? "syntax error: " : "value error: ") + what);
  }
  if (!duplicate.empty()) {
    throw ConfigError(origin + ": " + duplicate + ": the key appears twice in one object (DeepSpeed refuses this too)");
  }
  Node root = from_json(j);
  JsonLines(text).assign(root);
  return root;
}

Format format_of(const std::string& path, std::string_view text) {
  if (ends_with(path, ".toml")) return Format::toml;
  if (ends_with(path, ".json")) return Format::json;
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && text[first] == '{' ? Format::json : Format::toml;
}

Config load_config_text(std::string_view text, Format format, const std::string& origin) {
  const Node root = format == Format::toml ? parse_toml_text(text, origin) : parse_json_text(text, origin);
  Config config;
  config.source = origin;
  detail::ErrorList errors(origin);
  detail::decode(root, config, errors);
  errors.raise_if_any();
  validate(config);
  return config;
}

Config load_config(const std::string& path) {
  const std::string text = read_file(path);
  return load_config_text(text, format_of(path, text), path);
}

}  // namespace tessera::config
