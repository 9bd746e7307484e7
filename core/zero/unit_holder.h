// tessera::Unit<H> is a drop-in replacement for a LibTorch module holder (torch::nn::Linear, a
// TORCH_MODULE of your own, ...) that lets a ZeRO-3 engine gather the module's parameters just
// before its forward and release them after (unit_hooks.h). Change the member's type and nothing
// else: registration, names, state dicts and `->` access stay the same, and without a stage-3
// engine it is a plain holder (one atomic load per call).
//
//   struct Block : torch::nn::Module {
//     tessera::Unit<torch::nn::Linear> fc{nullptr};
//     Block() { fc = register_module("fc", torch::nn::Linear(4, 8)); }
//     at::Tensor forward(const at::Tensor& x) { return fc(x); }   // gathered around this call
//   };
//
// Only calls through the holder are bracketed: fc->forward(x) bypasses it. Outputs that are a
// Tensor, a tuple or a vector of Tensors get the pre-backward hooks; any other output type keeps
// the unit gathered until its gradients are ready (correct, but it holds the memory longer).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/zero/unit_hooks.h"

namespace tessera {

namespace unit_detail {

inline bool collect(const at::Tensor& t, std::vector<at::Tensor>& out) {
  out.push_back(t);
  return true;
}
inline bool collect(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
  return true;
}
template <class... Ts>
bool collect(const std::tuple<Ts...>& tuple, std::vector<at::Tensor>& out);
template <class A, class B>
bool collect(const std::pair<A, B>& pair, std::vector<at::Tensor>& out) {
  const bool a = collect(pair.first, out);
  const bool b = collect(pair.second, out);
  return a && b;
}
template <class T>
bool collect(const T&, std::vector<at::Tensor>&) {
  return std::is_arithmetic_v<T>;  // numbers carry no gradient; anything else is unknown
}
template <class... Ts>
bool collect(const std::tuple<Ts...>& tuple, std::vector<at::Tensor>& out) {
  return std::apply([&](const auto&... item) { return (collect(item, out) & ... & true); }, tuple);
}

}  // namespace unit_detail

template <class Holder>
class Unit : public Holder {
 public:
  using Impl = typename Holder::ContainedType;

  /* implicit */ Unit(std::nullptr_t) : Holder(nullptr) {}
  /* implicit */ Unit(std::shared_ptr<Impl> module) : Holder(std::move(module)) { note(); }
  /* implicit */ Unit(Holder holder) : Holder(std::move(holder)) { note(); }
  template <class Head, class... Tail,
            class = std::enable_if_t<!std::is_same_v<std::decay_t<Head>, Unit> &&
                                     !std::is_same_v<std::decay_t<Head>, Holder> &&
                                     !std::is_same_v<std::decay_t<Head>, std::nullptr_t> &&
                                     !std::is_convertible_v<Head, std::shared_ptr<Impl>>>>
  explicit Unit(Head&& head, Tail&&... tail) : Holder(std::forward<Head>(head), std::forward<Tail>(tail)...) {
    note();
  }

  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    zero::UnitCall call(this->get());
    if (!call.active()) return Holder::operator()(std::forward<Args>(args)...);
    auto out = Holder::operator()(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    const bool known = unit_detail::collect(out, tensors);
    call.finish(tensors, !known);
    return out;
  }

 private:
  void note() {
    if (!this->is_empty()) zero::note_held(this->ptr());
  }
};

}  // namespace tessera
