// UnitHooks connect ZeRO-3 units to whoever gathers and releases them: a process-wide registry
// from a module (its Impl pointer) to the listener (a stage-3 engine) that made it a unit, and
// the calls a unit holder (unit_holder.h) makes around the module's forward.
//
// Stock LibTorch modules have no forward hooks in C++, so the holder brackets the call:
//   before_forward  the listener gathers the unit's parameters;
//   after_forward   outputs that require grad get a tensor hook (it fires before the unit's own
//                   backward nodes, so the listener gathers again for backward), then the
//                   listener releases the unit unless it must stay (outputs it could not hook).
// Modules nobody registered cost one relaxed atomic load per call. Several listeners (engines)
// may register disjoint modules; registering a module twice is an error.
//
// Held modules: a holder notes every module it holds, so an engine can refuse, before it changes
// anything, a unit whose module no holder calls (its released parameters would fail on access).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tessera::zero {

class UnitListener {
 public:
  virtual ~UnitListener() = default;
  virtual void before_forward(int64_t unit) = 0;
  // `keep`: an output needs grad but could not be hooked; the unit stays gathered until its
  // gradients are ready.
  virtual void after_forward(int64_t unit, bool keep) = 0;
  virtual void before_backward(int64_t unit) = 0;
};

// Registers `modules[i]` as unit `i` of `listener` (nullptr entries are skipped). Throws
// tessera::Error when a module already belongs to a listener.
void register_units(const std::shared_ptr<UnitListener>& listener, const std::vector<const torch::nn::Module*>& modules);
// Forgets every module of `listener`.
void unregister_units(const UnitListener* listener);
// Whether `module` is a unit of a live listener.
bool is_unit(const torch::nn::Module* module);

// Whether some unit holder holds `module` (and it is still alive).
bool is_held(const torch::nn::Module* module);
void note_held(const std::shared_ptr<torch::nn::Module>& module);

// One call of a held module: before_forward at construction (if the module is a unit), and
// finish(outputs) or, on an exception, the destructor releases it.
class UnitCall {
 public:
  explicit UnitCall(const torch::nn::Module* module);
  ~UnitCall();
  UnitCall(const UnitCall&) = delete;
  UnitCall& operator=(const UnitCall&) = delete;

  bool active() const { return listener_ != nullptr; }
  // After the forward: hooks every tensor in `outputs` that requires grad, then after_forward.
  void finish(const std::vector<at::Tensor>& outputs, bool unknown_outputs);

 private:
  std::shared_ptr<UnitListener> listener_;
  int64_t unit_ = -1;
};

}  // namespace tessera::zero
