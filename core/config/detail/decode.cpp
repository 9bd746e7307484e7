#include "core/config/detail/decode.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "core/config/detail/enum_names.h"
#include "core/config/detail/fields.h"
#include "core/config/keys.h"
#include "core/config/resolve_auto.h"

namespace tessera::config::detail {
namespace {

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string list_words(const std::vector<std::string>& words) {
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i) out += (i ? ", " : "") + words[i];
  return out;
}

// DeepSpeed reads a null like a missing key; TOML cannot write one. Dropping nulls inside tables
// keeps pass-through values equal across both syntaxes.
Node without_nulls(const Node& node) {
  Node out = node;
  if (node.is_table()) {
    out.fields.clear();
    for (const auto& [key, value] : node.fields) {
      if (value.kind != Node::Kind::null) out.fields.emplace_back(key, without_nulls(value));
    }
  }
  return out;
}

template <class T> struct IsAuto : std::false_type {};
template <class T> struct IsAuto<Auto<T>> : std::true_type {};
template <class T> constexpr bool is_auto_v = IsAuto<T>::value;

// Collects every key name a field list mentions, whether or not it applies.
struct KeyProbe {
  std::vector<std::string> keys;
  template <class T> void field(const char* k, T&, bool = true) { keys.emplace_back(k); }
};

class Decoder {
 public:
  // Nodes found in one scope are read while deeper scopes are pushed; reserving keeps the stack
  // from moving (files nest at most five tables deep).
  Decoder(Config& config, ErrorList& errors) : config_(config), errors_(errors) { stack_.reserve(16); }

  void decode_root(const Node& root) {
    if (!root.is_table()) {
      errors_.add("", root.line, "expected a table of settings, got " + kind_name(root));
      return;
    }
    enter(root, "", "");
    visit(config_, *this);
    decode_optimizer();
    decode_scheduler();
    leave();
    apply_dependent_defaults();
  }

  // ---- visitor interface (detail/fields.h) ----
  template <class T>
  void field(const char* key, T& value, bool applies = true) {
    Scope& s = stack_.back();
    const std::string path = join(s.path, key);
    if (applies) s.modelled.emplace_back(key);
    const Node* node = s.table.find(key);
    if (node == nullptr || node->kind == Node::Kind::null) {
      if (node != nullptr) s.consumed.emplace_back(key);
      if (applies && s.keep_provenance) config_.provenance.set(path, Origin::default_value);
      return;
    }
    if (!applies) return;  // reported by check_rest, which knows the keys that do apply
    s.consumed.emplace_back(key);
    if constexpr (!is_auto_v<T>) {
      // DeepSpeed's ZeRO config classes drop "auto" values they have no rule for and use their
      // default (OpenRLHF's configs rely on it for sub_group_size and stage3_max_live_parameters).
      if (node->is_auto() && s.section.rfind("zero_optimization", 0) == 0) {
        config_.provenance.set(path, Origin::default_value, "\"auto\" without a rule is DeepSpeed's default", node->line);
        return;
      }
    }
    if (read(*node, path, value)) mark_read(path, value, node->line);
  }

  template <class S>
  void section(const char* key, S& value) {
    Scope& s = stack_.back();
    s.modelled.emplace_back(key);
    const std::string path = join(s.path, key), section = join(s.section, key);
    const Node* node = s.table.find(key);
    if (node != nullptr) s.consumed.emplace_back(key);
    if (node != nullptr && node->kind != Node::Kind::null && !node->is_table()) {
      errors_.add(path, node->line, "expected a table, got " + kind_name(*node) + " " + to_json_text(*node));
      return;
    }
    enter(node != nullptr && node->is_table() ? *node : Node::make_table(), path, section);
    visit(value, *this);
    leave();
  }

  void specs(const char* key, std::vector<LayerSpec>& value) {
    Scope& s = stack_.back();
    s.modelled.emplace_back(key);
    const std::string path = join(s.path, key), section = join(s.section, key);
    const Node* node = s.table.find(key);
    if (node == nullptr || node->kind == Node::Kind::null) {
      config_.provenance.set(path, Origin::default_value);
      return;
    }
    s.consumed.emplace_back(key);
    config_.provenance.set(path, Origin::given);
    if (node->kind != Node::Kind::array) {
      errors_.add(path, node->line, "expected a list of layer specs, got " + kind_name(*node));
      return;
    }
    for (std::size_t i = 0; i < node->items.size(); ++i) {
      const Node& item = node->items[i];
      const std::string item_path = path + "[" + std::to_string(i) + "]";
      if (!item.is_table()) {
        errors_.add(item_path, item.line, "expected a table (patterns, partition_type, ...), got " + kind_name(item));
        continue;
      }
      LayerSpec spec;
      enter(item, item_path, section);
      stack_.back().keep_provenance = false;
      visit(spec, *this);
      if (item.find("patterns") == nullptr) errors_.add(item_path + ".patterns", item.line, "required, missing");
      leave();
      value.push_back(std::move(spec));
    }
  }

 private:
  struct Scope {
    Node table;            // aliases already renamed to their targets
    std::string path;      // as shown to users: "tensor_parallel.partition_config.layer_specs[1]"
    std::string section;   // as the registry names it: "tensor_parallel.partition_config.layer_specs"
    std::string not_applicable_context;  // "optimizer type SGD"
    std::vector<std::string> modelled;   // keys that apply here
    std::vector<std::string> consumed;
    bool keep_provenance = true;
  };

  void enter(const Node& table, const std::string& path, const std::string& section) {
    Scope scope;
    scope.table = table;
    scope.path = path;
    scope.section = section;
    rename_aliases(scope);
    stack_.push_back(std::move(scope));
  }

  void leave() {
    check_rest(stack_.back());
    stack_.pop_back();
  }

  void rename_aliases(Scope& scope) {
    for (auto& [key, value] : scope.table.fields) {
      const KeyRule* rule = find_key_rule(scope.section, key);
      if (rule == nullptr || rule->kind != KeyKind::alias) continue;
      const std::string target = rule->detail;
      if (scope.table.find(target) != nullptr) {
        errors_.add(join(scope.path, key), value.line,
                    "both \"" + key + "\" and \"" + target + "\" are set; they are one setting (alias), keep one");
        continue;
      }
      config_.warnings.push_back(join(scope.path, key) + ": read as " + join(scope.path, target) +
                                 " (DeepSpeed's older name)");
      key = target;
    }
  }

  void check_rest(const Scope& s) {
    for (const auto& [key, value] : s.table.fields) {
      if (!key.empty() && key[0] == '_') continue;  // comment keys
      if (std::find(s.consumed.begin(), s.consumed.end(), key) != s.consumed.end()) continue;
      const std::string path = join(s.path, key);
      if (const KeyRule* rule = find_key_rule(s.section, key)) {
        if (rule->kind == KeyKind::alias) continue;  // already reported
        if (value.kind != Node::Kind::null) config_.passthrough[path] = to_json_text(without_nulls(value));
        if (rule->kind == KeyKind::unsupported && !is_inert(*rule, value)) {
          config_.unsupported.push_back(UnsupportedKey{path, to_json_text(value), rule->why});
        } else {
          config_.warnings.push_back(path + ": accepted and ignored (" +
                                     (rule->kind == KeyKind::ignored ? std::string(rule->why)
                                                                     : "its value asks for nothing") + ")");
        }
        continue;
      }
      if (!s.not_applicable_context.empty() && is_other_variant_key(s.section, key)) {
        errors_.add(path, value.line, "not a parameter of " + s.not_applicable_context + " (it takes: " +
                                          list_words(s.modelled) + ")");
        continue;
      }
      std::vector<std::string> candidates = s.modelled;
      for (std::string& k : registry_keys(s.section)) candidates.push_back(std::move(k));
      const std::string suggestion = closest_key(key, candidates);
      errors_.add(path, value.line,
                  "unknown key \"" + key + "\"" +
                      (suggestion.empty() ? std::string(" (neither a DeepSpeed nor a tessera key)")
                                          : "; did you mean \"" + suggestion + "\"?"));
    }
  }

  static bool is_other_variant_key(const std::string& section, const std::string& key) {
    KeyProbe probe;
    if (section == "optimizer.params") {
      OptimizerConfig o;
      visit(o, probe);
    } else {
      SchedulerConfig sc;
      visit(sc, probe);
    }
    return std::find(probe.keys.begin(), probe.keys.end(), key) != probe.keys.end();
  }

  // ---- optimizer and scheduler: the type decides the params ----
  template <class Section, class E>
  void decode_typed(const char* key, std::optional<Section>& out, bool (*deepspeed_only)(std::string_view)) {
    Scope& top = stack_.back();
    top.modelled.emplace_back(key);
    const Node* node = top.table.find(key);
    if (node == nullptr || node->kind == Node::Kind::null) return;
    top.consumed.emplace_back(key);
    if (!node->is_table()) {
      errors_.add(key, node->line, "expected a table with \"type\" and \"params\", got " + kind_name(*node));
      return;
    }
    const Node* type = node->find("type");
    const std::string type_path = std::string(key) + ".type";
    if (type == nullptr) {
      errors_.add(type_path, node->line, "required, missing (one of " + names_of<E>() + ")");
      return;
    }
    if (type->kind == Node::Kind::string && deepspeed_only(type->string)) {
      config_.passthrough[key] = to_json_text(without_nulls(*node));
      config_.unsupported.push_back(
          UnsupportedKey{type_path, to_json_text(*type), "the " + type->string + " " + std::string(key)});
      return;
    }
    Section section;
    if (!read(*type, type_path, section.type)) return;
    config_.provenance.set(type_path, Origin::given, {}, type->line);
    enter(*node, key, key);
    stack_.back().modelled = {"type", "params"};
    stack_.back().consumed = {"type", "params"};
    const Node* params = node->find("params");
    const std::string params_path = std::string(key) + ".params";
    if (params != nullptr && !params->is_table()) {
      errors_.add(params_path, params->line, "expected a table, got " + kind_name(*params));
    } else {
      enter(params != nullptr ? *params : Node::make_table(), params_path, params_path);
      stack_.back().not_applicable_context = std::string(key) + " type " + enum_name(section.type);
      visit(section, *this);
      leave();
    }
    leave();
    out = std::move(section);
  }

  void decode_optimizer() { decode_typed<OptimizerConfig, OptimizerType>("optimizer", config_.optimizer, is_deepspeed_only_optimizer); }
  void decode_scheduler() { decode_typed<SchedulerConfig, SchedulerType>("scheduler", config_.scheduler, is_deepspeed_only_scheduler); }

  template <class E> static std::string names_of() {
    std::vector<std::string> names;
    for (const auto& [v, name] : EnumNames<E>::kNames) names.emplace_back(name);
    return list_words(names);
  }

  // DeepSpeed turns overlap_comm on by default with stage 3.
  void apply_dependent_defaults() {
    ZeroConfig& z = config_.zero_optimization;
    const std::string path = "zero_optimization.overlap_comm";
    if (!z.stage.is_auto && z.stage.value == 3 && config_.provenance.get(path).origin == Origin::default_value) {
      z.overlap_comm = true;
      config_.provenance.set(path, Origin::default_value, "true with stage 3");
    }
  }

  // ---- provenance ----
  template <class T> void mark_read(const std::string& path, const T&, int line) {
    if (stack_.back().keep_provenance) config_.provenance.set(path, Origin::given, {}, line);
  }
  template <class T> void mark_read(const std::string& path, const Auto<T>& value, int line) {
    if (!stack_.back().keep_provenance) return;
    if (value.is_auto) {
      config_.provenance.set(path, Origin::pending_auto, fact_for(path), line);
    } else {
      config_.provenance.set(path, Origin::given, {}, line);
    }
  }

  // ---- values ----
  bool fail(const std::string& path, const Node& node, const std::string& expected, const std::string& hint = {}) {
    errors_.add(path, node.line, "expected " + expected + ", got " + to_json_text(node) +
                                     (node.kind == Node::Kind::string || node.kind == Node::Kind::table ||
                                              node.kind == Node::Kind::array
                                          ? " (" + kind_name(node) + ")"
                                          : "") + hint);
    return false;
  }

  template <class T> bool read(const Node& node, const std::string& path, Auto<T>& out) {
    if (node.is_auto()) {
      out = Auto<T>::automatic();
      return true;
    }
    T value = out.value;
    if (!read(node, path, value)) return false;
    out = Auto<T>(std::move(value));
    return true;
  }

  bool read(const Node& node, const std::string& path, bool& out) {
    if (node.kind != Node::Kind::boolean) return fail(path, node, "true or false" + auto_hint(path, node));
    out = node.boolean;
    return true;
  }

  bool read(const Node& node, const std::string& path, std::int64_t& out) {
    if (node.kind == Node::Kind::integer) {
      out = node.integer;
      return true;
    }
    if (node.kind == Node::Kind::floating && std::isfinite(node.floating) && std::floor(node.floating) == node.floating &&
        std::fabs(node.floating) < 9.2e18) {
      out = static_cast<std::int64_t>(node.floating);
      return true;
    }
    return fail(path, node, "an integer" + auto_hint(path, node));
  }

  bool read(const Node& node, const std::string& path, double& out) {
    if (node.kind == Node::Kind::integer) {
      out = static_cast<double>(node.integer);
      return true;
    }
    if (node.kind == Node::Kind::floating) {
      out = node.floating;
      return true;
    }
    return fail(path, node, "a number" + auto_hint(path, node));
  }

  bool read(const Node& node, const std::string& path, std::string& out) {
    if (node.kind != Node::Kind::string) return fail(path, node, "a string");
    out = node.string;
    return true;
  }

  bool read(const Node& node, const std::string& path, std::vector<std::string>& out) {
    if (node.kind != Node::Kind::array) return fail(path, node, "a list of strings");
    out.clear();
    bool ok = true;
    for (std::size_t i = 0; i < node.items.size(); ++i) {
      std::string item;
      ok = read(node.items[i], path + "[" + std::to_string(i) + "]", item) && ok;
      out.push_back(std::move(item));
    }
    return ok;
  }

  bool read(const Node& node, const std::string& path, std::array<double, 2>& out) {
    if (node.kind != Node::Kind::array || node.items.size() != 2) {
      return fail(path, node, "a list of two numbers [beta1, beta2]" + auto_hint(path, node));
    }
    return read(node.items[0], path + "[0]", out[0]) && read(node.items[1], path + "[1]", out[1]);
  }

  bool read(const Node& node, const std::string& path, std::vector<ShapeDim>& out) {
    if (node.kind != Node::Kind::array) return fail(path, node, "a list of sizes such as [2, -1] or [[4096, 1024, 1024], -1]");
    out.clear();
    bool ok = true;
    for (std::size_t i = 0; i < node.items.size(); ++i) {
      const Node& item = node.items[i];
      const std::string item_path = path + "[" + std::to_string(i) + "]";
      ShapeDim dim;
      if (item.kind == Node::Kind::array) {
        for (std::size_t j = 0; j < item.items.size(); ++j) {
          std::int64_t part = 0;
          ok = read(item.items[j], item_path + "[" + std::to_string(j) + "]", part) && ok;
          dim.parts.push_back(part);
        }
        if (item.items.empty()) ok = fail(item_path, item, "a non-empty list of sizes");
      } else {
        ok = read(item, item_path, dim.size) && ok;
      }
      out.push_back(std::move(dim));
    }
    return ok;
  }

  template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
  bool read(const Node& node, const std::string& path, E& out) {
    std::vector<std::string> names;
    for (const auto& [v, name] : EnumNames<E>::kNames) names.emplace_back(name);
    if (node.kind == Node::Kind::string) {
      for (const auto& [v, name] : EnumNames<E>::kNames) {
        if (iequals(node.string, name)) {
          out = v;
          return true;
        }
      }
      const std::string suggestion = closest_key(node.string, names);
      return fail(path, node, "one of " + list_words(names),
                  suggestion.empty() ? std::string() : "; did you mean \"" + suggestion + "\"?");
    }
    return fail(path, node, "one of " + list_words(names));
  }

  // "auto" where it is not accepted gets a hint, so the user knows it was understood.
  static std::string auto_hint(const std::string& path, const Node& node) {
    if (!node.is_auto()) return {};
    (void)path;
    return "; \"auto\" is not accepted for this key";
  }

  Config& config_;
  ErrorList& errors_;
  std::vector<Scope> stack_;
};

}  // namespace

void decode(const Node& root, Config& out, ErrorList& errors) {
  Decoder decoder(out, errors);
  decoder.decode_root(root);
}

}  // namespace tessera::config::detail
