#include "core/zero/sequential_units.h"

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <tuple>
#include <typeinfo>
#include <unordered_set>
#include <utility>

#include "core/error.h"
#include "core/zero/unit_hooks.h"

namespace tessera::zero {
namespace {

using torch::nn::AnyModule;
using torch::nn::AnyValue;

// What a swapped entry holds: the original entry, called inside the unit's bracket.
struct BracketedEntry : torch::nn::Module {
  explicit BracketedEntry(AnyModule original_entry) : original(std::move(original_entry)) {}
  // Never called: it only tells AnyModule which holder to build (the specialisation below).
  at::Tensor forward(at::Tensor x) { return x; }
  AnyValue call(std::vector<AnyValue>&& arguments);
  AnyModule original;
};

template <size_t... I>
AnyValue forward_unpacked(AnyModule& module, std::vector<AnyValue>& arguments, std::index_sequence<I...>) {
  return module.any_forward(std::move(arguments[I])...);  // moves each AnyValue as it is
}

AnyValue forward_all(AnyModule& module, std::vector<AnyValue>&& a) {
  switch (a.size()) {
    case 0: return forward_unpacked(module, a, std::make_index_sequence<0>{});
    case 1: return forward_unpacked(module, a, std::make_index_sequence<1>{});
    case 2: return forward_unpacked(module, a, std::make_index_sequence<2>{});
    case 3: return forward_unpacked(module, a, std::make_index_sequence<3>{});
    case 4: return forward_unpacked(module, a, std::make_index_sequence<4>{});
    case 5: return forward_unpacked(module, a, std::make_index_sequence<5>{});
    case 6: return forward_unpacked(module, a, std::make_index_sequence<6>{});
    default:
      throw Error("ZeRO-3: a Sequential entry (" + module.ptr()->name() + ") was called with " +
                  std::to_string(a.size()) + " arguments; stage 3 brackets entries of at most 6");
  }
}

// The outputs the unit's pre-backward hooks go on, as a holder finds them (unit_holder.h);
// false: a type this cannot look into.
bool collect_outputs(AnyValue& out, std::vector<at::Tensor>& tensors) {
  if (const auto* t = out.try_get<at::Tensor>()) return tensors.push_back(*t), true;
  if (const auto* v = out.try_get<std::vector<at::Tensor>>()) return tensors.insert(tensors.end(), v->begin(), v->end()), true;
  if (const auto* p = out.try_get<std::tuple<at::Tensor, at::Tensor>>())
    return tensors.push_back(std::get<0>(*p)), tensors.push_back(std::get<1>(*p)), true;
  return false;
}

AnyValue BracketedEntry::call(std::vector<AnyValue>&& arguments) {
  UnitCall bracket(original.ptr().get());
  auto out = forward_all(original, std::move(arguments));
  if (bracket.active()) {
    std::vector<at::Tensor> tensors;
    const bool known = collect_outputs(out, tensors);
    bracket.finish(tensors, !known);
  }
  return out;
}

}  // namespace
}  // namespace tessera::zero

namespace torch::nn {

// AnyModule's holder of a BracketedEntry: it forwards to the entry's call and reports the
// original module as the entry's module, so Sequential::ptr(i) and seq[i] are unchanged. Its
// type_info stays BracketedEntry's (a typed cast of the entry refuses rather than misreads).
template <>
struct AnyModuleHolder<tessera::zero::BracketedEntry, at::Tensor> : public AnyModulePlaceholder {
  explicit AnyModuleHolder(std::shared_ptr<tessera::zero::BracketedEntry>&& entry)
      : AnyModulePlaceholder(typeid(tessera::zero::BracketedEntry)), module(std::move(entry)) {}
  AnyValue forward(std::vector<AnyValue>&& arguments) override { return module->call(std::move(arguments)); }
  std::shared_ptr<Module> ptr() override { return module->original.ptr(); }
  std::unique_ptr<AnyModulePlaceholder> copy() const override { return std::make_unique<AnyModuleHolder>(*this); }
  // A clone is a plain model: its entry wraps a clone of the original, which is no engine's unit.
  std::unique_ptr<AnyModulePlaceholder> clone_module(optional<Device> device) const override {
    return std::make_unique<AnyModuleHolder>(std::make_shared<tessera::zero::BracketedEntry>(module->original.clone(device)));
  }
  std::shared_ptr<tessera::zero::BracketedEntry> module;  // AnyModule::get<T> reads this member
};

}  // namespace torch::nn

namespace tessera::zero {

struct SequentialUnits::Swapped {
  std::weak_ptr<torch::nn::SequentialImpl> sequential;
  size_t index = 0;
  AnyModule original;
  const torch::nn::Module* module = nullptr;
};

SequentialUnits::SequentialUnits(torch::nn::Module& model, const std::vector<const torch::nn::Module*>& units) {
  const std::unordered_set<const torch::nn::Module*> wanted(units.begin(), units.end());
  std::unordered_set<const torch::nn::Module*> seen;  // a Sequential registered twice is swapped once
  for (const auto& m : model.modules(/*include_self=*/true)) {
    auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m);
    if (!sequential || !seen.insert(sequential.get()).second) continue;
    size_t index = 0;
    for (auto it = sequential->begin(); it != sequential->end(); ++it, ++index) {
      const auto inner = it->ptr();
      if (!wanted.count(inner.get())) continue;
      auto swapped = std::make_unique<Swapped>();
      swapped->sequential = sequential;
      swapped->index = index;
      swapped->original = *it;
      swapped->module = inner.get();
      *it = AnyModule(std::make_shared<BracketedEntry>(*it));
      swapped_.push_back(std::move(swapped));
    }
  }
}

SequentialUnits::~SequentialUnits() {
  for (auto s = swapped_.rbegin(); s != swapped_.rend(); ++s) {
    auto sequential = (*s)->sequential.lock();
    if (!sequential || (*s)->index >= sequential->size()) continue;
    auto it = sequential->begin() + std::ptrdiff_t((*s)->index);
    if (it->type_info() == typeid(BracketedEntry)) *it = (*s)->original;
  }
}

bool SequentialUnits::brackets(const torch::nn::Module* module) const {
  for (const auto& s : swapped_)
    if (s->module == module) return true;
  return false;
}

}  // namespace tessera::zero
