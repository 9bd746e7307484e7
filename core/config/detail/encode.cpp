#include "core/config/detail/encode.h"

#include <algorithm>

#include "core/config/detail/enum_names.h"
#include "core/config/detail/fields.h"

namespace tessera::config::detail {
namespace {

class Encoder {
 public:
  explicit Encoder(Node& root) { stack_.push_back(&root); }

  template <class T>
  void field(const char* key, T& value, bool applies = true) {
    if (!applies) return;
    if constexpr (std::is_same_v<T, Auto<std::int64_t>>) {
      if (!value.is_auto && value.value == 0 && means_not_given(key)) return;
    }
    stack_.back()->set(key, to_node(value));
  }

  template <class S>
  void section(const char* key, S& value) {
    Node& table = stack_.back()->set(key, Node::make_table());
    stack_.push_back(&table);
    visit(value, *this);
    stack_.pop_back();
  }

  void specs(const char* key, std::vector<LayerSpec>& value) {
    Node list = Node::make_array();
    for (LayerSpec& spec : value) {
      Node table = Node::make_table();
      stack_.push_back(&table);
      visit(spec, *this);
      stack_.pop_back();
      list.items.push_back(std::move(table));
    }
    stack_.back()->set(key, std::move(list));
  }

  template <class Section>
  void typed(const char* key, Section& value) {
    Node& table = stack_.back()->set(key, Node::make_table());
    table.set("type", Node::of(std::string(enum_name(value.type))));
    Node& params = table.set("params", Node::make_table());
    stack_.push_back(&params);
    visit(value, *this);
    stack_.pop_back();
  }

 private:
  // Batch sizes and total_num_steps use 0 for "not given"; writing 0 would read back as given.
  static bool means_not_given(const std::string& key) {
    return key == "train_batch_size" || key == "train_micro_batch_size_per_gpu" || key == "gradient_accumulation_steps" ||
           key == "total_num_steps";
  }

  static Node to_node(bool v) { return Node::of(v); }
  static Node to_node(std::int64_t v) { return Node::of(v); }
  static Node to_node(double v) { return Node::of(v); }
  static Node to_node(const std::string& v) { return Node::of(v); }
  static Node to_node(const std::vector<std::string>& v) {
    Node n = Node::make_array();
    for (const std::string& s : v) n.items.push_back(Node::of(s));
    return n;
  }
  static Node to_node(const std::array<double, 2>& v) {
    Node n = Node::make_array();
    n.items = {Node::of(v[0]), Node::of(v[1])};
    return n;
  }
  static Node to_node(const std::vector<ShapeDim>& v) {
    Node n = Node::make_array();
    for (const ShapeDim& dim : v) {
      if (dim.parts.empty()) {
        n.items.push_back(Node::of(dim.size));
      } else {
        Node parts = Node::make_array();
        for (std::int64_t p : dim.parts) parts.items.push_back(Node::of(p));
        n.items.push_back(std::move(parts));
      }
    }
    return n;
  }
  template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
  static Node to_node(E v) { return Node::of(std::string(enum_name(v))); }
  template <class T>
  static Node to_node(const Auto<T>& v) { return v.is_auto ? Node::of(std::string("auto")) : to_node(v.value); }

  std::vector<Node*> stack_;
};

// Puts a pass-through value at its dotted path. Its JSON text came from to_json_text, which
// parse_json_text reads back.
void put_passthrough(Node& root, const std::string& path, const std::string& json_text) {
  const std::size_t dot = path.rfind('.');
  Node& table = dot == std::string::npos ? root : root.table_at(path.substr(0, dot));
  table.set(dot == std::string::npos ? path : path.substr(dot + 1), parse_json_text(json_text, path));
}

}  // namespace

Node encode(const Config& config) {
  Config copy = config;  // the visitors take non-const references
  Node root = Node::make_table();
  Encoder encoder(root);
  visit(copy, encoder);
  if (copy.optimizer) encoder.typed("optimizer", *copy.optimizer);
  if (copy.scheduler) encoder.typed("scheduler", *copy.scheduler);
  // Read top-down like DeepSpeed's documentation: batch, precision, optimizer, scheduler, ZeRO, ...
  auto& fields = root.fields;
  const auto precision_end = std::find_if(fields.begin(), fields.end(), [](const auto& f) { return f.first == "zero_optimization"; });
  const auto typed_begin = std::find_if(fields.begin(), fields.end(), [](const auto& f) {
    return f.first == "optimizer" || f.first == "scheduler";
  });
  if (precision_end != fields.end() && typed_begin != fields.end() && precision_end < typed_begin) {
    std::rotate(precision_end, typed_begin, fields.end());
  }
  for (const auto& [path, text] : copy.passthrough) put_passthrough(root, path, text);
  return root;
}

}  // namespace tessera::config::detail
