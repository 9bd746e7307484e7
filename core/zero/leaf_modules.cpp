#include "core/zero/leaf_modules.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "core/error.h"

namespace tessera {
namespace {

struct Marks {
  std::mutex mutex;
  std::map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> marked;
};

Marks& marks() {
  static Marks* m = new Marks;  // never destroyed (modules may die during static destruction)
  return *m;
}

void mark(const std::shared_ptr<torch::nn::Module>& m) {
  auto& r = marks();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.marked[m.get()] = m;
}

std::string strip_impl(std::string s) {
  if (s.size() > 4 && s.compare(s.size() - 4, 4, "Impl") == 0) s.resize(s.size() - 4);
  return s;
}

std::string last_part(const std::string& s) {
  const auto colon = s.rfind("::");
  const auto dot = s.rfind('.');
  size_t from = 0;
  if (colon != std::string::npos) from = colon + 2;
  if (dot != std::string::npos && dot + 1 > from) from = dot + 1;
  return s.substr(from);
}

}  // namespace

bool z3_suffix_matches(const std::string& suffix, const std::string& name) {
  if (suffix.empty() || name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  const size_t at = name.size() - suffix.size();
  return at == 0 || name[at - 1] == '.';
}

bool z3_class_matches(const std::string& pattern, const std::string& module_name) {
  if (pattern.empty()) return false;
  // A C++-qualified pattern must match the qualified name; anything else matches the class itself.
  if (pattern.find("::") != std::string::npos) return strip_impl(pattern) == strip_impl(module_name);
  return strip_impl(last_part(pattern)) == strip_impl(last_part(module_name));
}

std::vector<std::string> set_z3_leaf_modules(torch::nn::Module& model, const std::vector<std::string>& classes) {
  std::vector<std::string> out;
  for (const auto& item : model.named_modules()) {
    for (const auto& c : classes) {
      if (!z3_class_matches(c, item.value()->name())) continue;
      mark(item.value());
      out.push_back(item.key());
      break;
    }
  }
  return out;
}

std::vector<std::string> set_z3_leaf_modules_by_name(torch::nn::Module& model, const std::vector<std::string>& names) {
  auto modules = model.named_modules();
  for (const auto& n : names)
    if (!modules.contains(n)) throw Error("set_z3_leaf_modules_by_name: the model has no module '" + n + "'");
  std::vector<std::string> out;
  for (const auto& item : modules) {
    if (std::find(names.begin(), names.end(), item.key()) == names.end()) continue;
    mark(item.value());
    out.push_back(item.key());
  }
  return out;
}

std::vector<std::string> set_z3_leaf_modules_by_suffix(torch::nn::Module& model, const std::vector<std::string>& suffixes) {
  std::vector<std::string> out;
  for (const auto& item : model.named_modules()) {
    for (const auto& s : suffixes) {
      if (!z3_suffix_matches(s, item.key())) continue;
      mark(item.value());
      out.push_back(item.key());
      break;
    }
  }
  return out;
}

void unset_z3_leaf_modules(torch::nn::Module& model, const std::vector<std::string>& classes) {
  auto& r = marks();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& item : model.named_modules()) {
    bool match = classes.empty();
    for (const auto& c : classes) match = match || z3_class_matches(c, item.value()->name());
    if (match) r.marked.erase(item.value().get());
  }
}

bool z3_leaf_module(const torch::nn::Module& module) {
  auto& r = marks();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.marked.find(&module);
  return it != r.marked.end() && !it->second.expired();
}

std::vector<std::string> get_z3_leaf_modules(torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_modules())
    if (z3_leaf_module(*item.value())) out.push_back(item.key());
  return out;
}

const std::vector<std::string>& default_z3_leaf_classes() {
  static const std::vector<std::string> classes = {
      "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
      "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
      "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock"};
  return classes;
}

}  // namespace tessera
