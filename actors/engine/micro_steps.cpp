#include "actors/engine/micro_steps.h"

#include <string>

#include "core/error.h"

namespace tessera::actors {

MicroSteps::MicroSteps(int64_t accumulation_steps, bool partitioned_gradients, bool distributed)
    : accumulation_steps_(accumulation_steps), partitioned_(partitioned_gradients), distributed_(distributed) {
  if (accumulation_steps < 1)
    throw Error("micro steps: gradient_accumulation_steps = " + std::to_string(accumulation_steps) + " < 1");
}

bool MicroSteps::reduces_now() const {
  return (partitioned_ || boundary()) && no_sync_depth_ == 0 && !coalescing_;
}

bool MicroSteps::arm_backward() {
  const bool reduce = reduces_now();
  if (reduce && refuses_second_reduction())
    throw Error("backward: called twice in the micro-step that ends gradient accumulation (micro-step " +
                std::to_string(micro_) + "); reduce once per boundary: call step() in between, or wrap the "
                "backwards in coalesce_grad_reduction()");
  armed_ = true;
  return reduce;
}

bool MicroSteps::arm_from_hook(bool& reduces) {
  reduces = false;
  if (armed_.exchange(true)) return false;
  unarmed_backward_ = true;
  if (!reduces_now()) return true;
  if (refuses_second_reduction()) {
    double_boundary_backward_ = true;
    return true;
  }
  reduces = true;
  return true;
}

void MicroSteps::start_reduction() {
  ++boundary_backwards_;
  if (boundary()) ++boundary_reductions_;
  reducing_ = distributed_;
}

void MicroSteps::end_backward() {
  reducing_ = false;
  armed_ = false;
}

bool MicroSteps::begin_step(bool fp16) {
  if (!boundary()) {
    ++micro_;
    return false;
  }
  if (in_block())
    throw Error(std::string("step: called inside ") + (coalescing_ ? "coalesce_grad_reduction()" : "no_sync()") +
                "; end the block first");
  if (double_boundary_backward_)
    throw Error("step: two backwards ran in the micro-step that ends gradient accumulation; wrap them in "
                "coalesce_grad_reduction() (call zero_grad() and redo the micro-step)");
  if (fp16 && unarmed_backward_)
    throw Error("step: a backward ran on a loss the engine did not scale (fp16 needs engine.backward(loss) or "
                "engine.scale(loss).backward()); the gradients are wrong by the loss scale. Call zero_grad() and "
                "redo the micro-step");
  return true;
}

void MicroSteps::updated() {
  unarmed_backward_ = false;
  double_boundary_backward_ = false;
  ++micro_;
  boundary_backwards_ = 0;
  boundary_reductions_ = 0;
}

void MicroSteps::zero_grad() {
  unarmed_backward_ = false;
  double_boundary_backward_ = false;
  boundary_backwards_ = 0;
  boundary_reductions_ = 0;
}

void MicroSteps::enter_no_sync() {
  if (coalescing_) throw Error("no_sync: cannot be used inside coalesce_grad_reduction()");
  ++no_sync_depth_;
}

void MicroSteps::enter_coalesce() {
  if (no_sync_depth_ > 0) throw Error("coalesce_grad_reduction: cannot be nested inside no_sync()");
  if (coalescing_) throw Error("coalesce_grad_reduction: already inside a coalesce_grad_reduction() block");
  coalescing_ = true;
}

bool MicroSteps::exit_coalesce() {
  coalescing_ = false;
  return reduces_now() && !refuses_second_reduction();
}

}  // namespace tessera::actors
