#include "core/zero/grad_ready_hooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <mutex>

#include "core/error.h"

namespace tessera::zero {

struct GradReadyHooks::State {
  std::mutex mutex;
  bool armed = true;
  bool end_queued = false;
  ReadyCallback on_ready;
  BackwardEndCallback on_end;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // pinned
};

namespace {

class ReadyPostHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyPostHook(std::weak_ptr<GradReadyHooks::State> state, int64_t index) : state_(std::move(state)), index_(index) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    auto state = state_.lock();
    if (!state) return outputs;
    bool queue_end = false;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (!state->armed) return outputs;
      if (!state->end_queued) state->end_queued = queue_end = true;
    }
    if (queue_end) {
      std::weak_ptr<GradReadyHooks::State> weak = state;
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        auto s = weak.lock();
        if (!s) return;
        GradReadyHooks::BackwardEndCallback end;
        {
          std::lock_guard<std::mutex> lock(s->mutex);
          s->end_queued = false;
          if (!s->armed) return;
          end = s->on_end;
        }
        if (end) end();
      });
    }
    state->on_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<GradReadyHooks::State> state_;
  int64_t index_;
};

}  // namespace

GradReadyHooks::GradReadyHooks(const std::vector<at::Tensor>& parameters, ReadyCallback on_ready,
                               BackwardEndCallback on_end)
    : state_(std::make_shared<State>()) {
  if (!on_ready) throw Error("GradReadyHooks: the ready callback is empty");
  state_->on_ready = std::move(on_ready);
  state_->on_end = std::move(on_end);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& p = parameters[i];
    if (!p.defined() || !p.is_leaf() || !p.requires_grad())
      throw Error("GradReadyHooks: parameter " + std::to_string(i) + " is not a leaf that requires grad");
    auto accumulator = torch::autograd::impl::grad_accumulator(p);
    if (!accumulator) throw Error("GradReadyHooks: parameter " + std::to_string(i) + " has no grad accumulator");
    accumulator->add_post_hook(std::make_unique<ReadyPostHook>(state_, int64_t(i)));
    state_->accumulators.push_back(std::move(accumulator));
  }
}

GradReadyHooks::~GradReadyHooks() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->armed = false;
}

}  // namespace tessera::zero
