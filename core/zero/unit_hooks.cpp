#include "core/zero/unit_hooks.h"

#include <torch/nn/module.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/zero/partitioned_construction.h"

namespace tessera::zero {
namespace {

struct Registry {
  std::mutex mutex;
  std::atomic<int64_t> units{0};  // registered modules (a fast path when there are none)
  std::unordered_map<const torch::nn::Module*, std::pair<std::weak_ptr<UnitListener>, int64_t>> units_of;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> held;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: holders may run during static destruction
  return *r;
}

}  // namespace

void register_units(const std::shared_ptr<UnitListener>& listener, const std::vector<const torch::nn::Module*>& modules) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto* m : modules) {
    if (!m) continue;
    auto it = r.units_of.find(m);
    if (it != r.units_of.end() && !it->second.first.expired())
      throw Error("ZeRO-3: a module (" + m->name() + ") is already a unit of another engine; each module can belong to one engine");
  }
  for (size_t i = 0; i < modules.size(); ++i)
    if (modules[i]) r.units_of[modules[i]] = {listener, int64_t(i)};
  int64_t n = 0;
  for (const auto& [m, entry] : r.units_of) n += entry.first.expired() ? 0 : 1;
  r.units = n;
}

void unregister_units(const UnitListener* listener) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.units_of.begin(); it != r.units_of.end();) {
    auto l = it->second.first.lock();
    if (!l || l.get() == listener) it = r.units_of.erase(it);
    else ++it;
  }
  r.units = int64_t(r.units_of.size());
}

bool is_unit(const torch::nn::Module* module) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.units_of.find(module);
  return it != r.units_of.end() && !it->second.first.expired();
}

bool is_held(const torch::nn::Module* module) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.held.find(module);
  return it != r.held.end() && !it->second.expired();
}

void note_held(const std::shared_ptr<torch::nn::Module>& module) {
  if (!module) return;
  auto& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    // Forget dead modules now and then so the table does not grow with every model ever built.
    if (r.held.size() > 1024 && r.held.size() % 1024 == 0)
      for (auto it = r.held.begin(); it != r.held.end();) it = it->second.expired() ? r.held.erase(it) : std::next(it);
    r.held[module.get()] = module;
  }
  partition_if_constructing(module);  // inside a PartitionedConstruction scope: cut it now
}

UnitCall::UnitCall(const torch::nn::Module* module) {
  auto& r = registry();
  if (r.units.load(std::memory_order_relaxed) == 0 || !module) return;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.units_of.find(module);
    if (it == r.units_of.end()) return;
    listener_ = it->second.first.lock();
    unit_ = it->second.second;
  }
  if (listener_) listener_->before_forward(unit_);
}

UnitCall::~UnitCall() {
  if (listener_) {
    try {
      listener_->after_forward(unit_, /*keep=*/false);  // the forward threw: release
    } catch (...) {
    }
  }
}

void UnitCall::finish(const std::vector<at::Tensor>& outputs, bool unknown_outputs) {
  if (!listener_) return;
  auto listener = std::move(listener_);
  listener_ = nullptr;
  bool keep = unknown_outputs;
  for (const auto& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    if (t.is_leaf()) {  // a parameter returned as is: a hook would stay on it forever
      keep = true;
      continue;
    }
    std::weak_ptr<UnitListener> weak = listener;
    const int64_t unit = unit_;
    // Runs when the gradient of this output is computed, before the nodes that produced it.
    t.register_hook([weak, unit](const at::Tensor&) {
      if (auto l = weak.lock()) l->before_backward(unit);
    });
  }
  listener->after_forward(unit_, keep && at::GradMode::is_enabled());
}

}  // namespace tessera::zero
