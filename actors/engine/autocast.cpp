#include "actors/engine/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/nn/module.h>

#include <set>

namespace tessera::actors {
namespace {

// "torch.nn.Linear" -> "torch::nn::Linear"; a trailing "Impl" is dropped on both sides.
std::string normalize(std::string name) {
  std::string out;
  for (char ch : name) {
    if (ch == '.') out += "::";
    else out += ch;
  }
  if (out.size() > 4 && out.compare(out.size() - 4, 4, "Impl") == 0) out.resize(out.size() - 4);
  return out;
}

bool matches(const std::string& type, const std::string& wanted) {
  const auto t = normalize(type), w = normalize(wanted);
  if (t == w) return true;
  // An unqualified name matches the last component of the type.
  if (w.find("::") == std::string::npos) {
    const auto pos = t.rfind("::");
    return pos != std::string::npos && t.substr(pos + 2) == w;
  }
  return false;
}

}  // namespace

std::vector<bool> lower_precision_parameters(const torch::nn::Module& model,
                                             const std::vector<std::string>& parameter_names,
                                             const std::vector<std::string>& safe_modules) {
  std::set<std::string> lower;
  for (const auto& item : model.named_modules()) {
    const auto& module = *item.value();
    bool safe = false;
    for (const auto& wanted : safe_modules) safe = safe || matches(module.name(), wanted);
    if (!safe) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : module.named_parameters(/*recurse=*/false)) lower.insert(prefix + p.key());
  }
  std::vector<bool> out;
  for (const auto& name : parameter_names) out.push_back(lower.count(name) > 0);
  return out;
}

AutocastGuard::AutocastGuard(bool enabled, at::ScalarType dtype)
    : previous_enabled_(at::autocast::is_cpu_enabled()), previous_dtype_(at::autocast::get_autocast_cpu_dtype()),
      nested_(enabled) {
  at::autocast::set_cpu_enabled(enabled);
  if (enabled) {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::increment_nesting();
  }
}

AutocastGuard::~AutocastGuard() {
  // As torch.autocast's __exit__: the outermost region drops the cached low-precision weights.
  if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(previous_enabled_);
  at::autocast::set_autocast_cpu_dtype(previous_dtype_);
}

}  // namespace tessera::actors
