// MicroSteps is the engine's micro-step state machine: which backward reduces its gradients and
// which step() is an update, under gradient accumulation, no_sync() and coalesce_grad_reduction()
// blocks, and backwards the engine was not told of (a plain loss.backward() on a joint loss). It
// holds no tensors and talks to nobody: the facade asks it and acts.
//
// Rules (DeepSpeed's, with tessera's extensions):
//   - micro-step m is an accumulation boundary when (m + 1) % accumulation_steps == 0;
//   - a backward reduces when it is at a boundary (with partitioned gradients: at every
//     micro-step, each adding into the partition) and outside no_sync and coalesce blocks;
//   - a second reduction in one boundary micro-step is refused (it would average already
//     averaged gradients), except with partitioned gradients, which add up;
//   - step() inside a block, after a refused second backward, or (fp16) after a backward the
//     engine did not scale, raises; step() at a non-boundary only counts the micro-step.
// Threads: the user's thread calls everything but hook_armed()/arm_from_hook(), which autograd's
// thread calls during a backward while the user's thread waits in it.
//
// Example: accumulation 2: backward (no reduce), step (micro 0 -> 1, no update), backward
// (reduces), step (update, micro 1 -> 2).
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera::actors {

// Reductions in the boundary micro-step with partitioned gradients: they add up, or (the update
// during backward starts with the first) only one is allowed.
enum class BoundaryReductions : uint8_t { add_up, once };

class MicroSteps {
 public:
  // `distributed`: more than one data-parallel rank (a single rank reduces nothing).
  MicroSteps(int64_t accumulation_steps, bool partitioned_gradients, bool distributed);

  bool boundary() const { return (micro_ + 1) % accumulation_steps_ == 0; }
  int64_t micro() const { return micro_; }
  // Whether this is the start of a batch with nothing accumulated or in flight (a checkpoint can
  // be taken or restored only here).
  bool at_batch_start() const {
    return micro_ % accumulation_steps_ == 0 && boundary_backwards_ == 0 && no_sync_depth_ == 0 && !coalescing_ &&
           !armed_.load() && !reducing_.load();
  }
  // A checkpoint's step count, at a batch start.
  void restore(int64_t micro) { micro_ = micro; }
  // Whether this backward's gradients go to the reducer (set by a reduction's start, cleared by end_backward).
  bool reducing() const { return reducing_.load(); }
  bool backward_unfinished() const { return armed_.load(); }  // armed, and its end never came
  bool two_boundary_backwards() const { return double_boundary_backward_.load(); }

  // Before a backward through backward()/scale(): whether it reduces. Throws tessera::Error for a
  // second reduction in the boundary micro-step, before anything changed.
  bool arm_backward();
  // The first gradient hook of any backward calls this: false if the backward was armed already;
  // else the backward is one the engine was not told of and is armed now: whether it reduces (a
  // refused second reduction is remembered and raised by step()).
  bool arm_from_hook(bool& reduces);
  // Any backward ended.
  void end_backward();

  // step(): throws (see above; `fp16` adds the unscaled-backward rule), else whether this step()
  // is an update. After an update call updated().
  bool begin_step(bool fp16) ;
  void updated();
  // zero_grad(): forgets this micro-step's backwards.
  void zero_grad();

  void enter_no_sync();
  void exit_no_sync() { --no_sync_depth_; }
  void enter_coalesce();
  // Leaves the block: whether the accumulated gradients must be reduced now.
  bool exit_coalesce();
  void set_boundary_reductions(BoundaryReductions r) { boundary_reductions_rule_ = r; }
  // A reduction starts now (after arm_backward/arm_from_hook/exit_coalesce said so).
  void start_reduction();
  bool in_block() const { return no_sync_depth_ > 0 || coalescing_; }
  // Whether a reducing backward in this micro-step happened (reductions may be outstanding).
  bool reduced_this_micro_step() const { return boundary_backwards_ > 0; }

 private:
  bool reduces_now() const;
  bool refuses_second_reduction() const {
    return (!partitioned_ && boundary_backwards_ > 0) ||
           (boundary_reductions_rule_ == BoundaryReductions::once && boundary() && boundary_reductions_ > 0);
  }

  const int64_t accumulation_steps_;
  const bool partitioned_;
  const bool distributed_;
  int64_t micro_ = 0;
  int boundary_backwards_ = 0;  // reducing backwards in the current boundary micro-step
  int boundary_reductions_ = 0;  // reductions started in a boundary micro-step (since the last update)
  BoundaryReductions boundary_reductions_rule_ = BoundaryReductions::add_up;
  int no_sync_depth_ = 0;
  bool coalescing_ = false;
  std::atomic<bool> reducing_{false};
  std::atomic<bool> armed_{false};           // a backward is expected (or running)
  std::atomic<bool> unarmed_backward_{false};  // a backward ran that the engine did not scale
  std::atomic<bool> double_boundary_backward_{false};
};

}  // namespace tessera::actors
