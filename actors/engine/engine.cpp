#include "actors/engine/engine.h"

#include "actors/engine/engine_impl.h"
#include "actors/engine/sigterm_flag.h"

#include <caf/all.hpp>
#include <torch/nn/module.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <optional>

#include "actors/actor_runtime.h"
#include "actors/ask.h"
#include "actors/bucket_staging.h"
#include "actors/client_optimizer.h"
#include "actors/engine/autocast.h"
#include "actors/engine/engine_settings.h"
#include "actors/engine/group_resolution.h"
#include "actors/engine/micro_steps.h"
#include "actors/engine/stage3_driver.h"
#include "actors/engine/stage3_units.h"
#include "actors/engine/storage_description.h"
#include "actors/engine_spec.h"
#include "actors/gradient_reducer.h"
#include "actors/optimizer_shard.h"
#include "actors/parameter_shard.h"
#include "actors/protocol.h"
#include "actors/unit_grad_staging.h"
#include "core/error.h"
#include "core/log/log.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/zero/grad_ready_hooks.h"
#include "core/zero/partitioned_construction.h"
#include "core/zero/stage3_parameters.h"
#include "core/zero/unit_hooks.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace tessera {

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

// An actor's state holds tensors (and, for a client Python optimizer, Python objects) that the
// caller may share: released on the actor's thread after the engine's destructor returned, they
// were released while the caller went on, and under Python while the interpreter finalised,
// where taking the GIL ends the thread ("terminate called without an active exception" at the
// end of about 1 run in 10 of the Python GRPO job at ZeRO-3). So the destructor waits for them.
// A caller that holds a lock the actors' teardown takes (the GIL) must release it first.
void Engine::Impl::stop_actors() {
  caf::scoped_actor self{actors::actor_system()};
  size_t running = 0;
  auto stop = [&](const auto& actor) {
    if (!actor) return;
    self->monitor(actor);
    self->send_exit(actor, caf::exit_reason::user_shutdown);
    ++running;
  };
  stop(reducer);
  stop(parameter_shard);
  stop(optimizer_shard);
  // Bounded: an actor inside a collective that will fail by its timeout is not waited for that long.
  const auto limit = std::min<std::chrono::milliseconds>(bound(), std::chrono::seconds(20));
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (running > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now());
    bool timed_out = left.count() <= 0;
    if (!timed_out)
      self->receive([&](const caf::down_msg&) { --running; }, caf::after(left) >> [&] { timed_out = true; });
    if (timed_out) {
      log::warn("engine: " + std::to_string(running) + " of its actors did not end within " +
                std::to_string(limit.count()) + " ms of the engine's destruction");
      return;
    }
  }
}

void Engine::Impl::on_grad_ready(int64_t param) {
  bool reduces = false;
  if (micro->arm_from_hook(reduces) && reduces) start_reduction(Trigger::hook);
  switch (spec->gradient_mode()) {
    case zero::GradientMode::unit_reduce_scatter:
      return stage3->grad_ready(param, micro->reducing());  // releases the unit too, reducing or not
    case zero::GradientMode::reduce_to_owner:
      if (micro->reducing()) staging->take(param);  // copied before the reducer hears of it (bucket_staging.h)
      return;
    case zero::GradientMode::all_reduce:
      if (micro->reducing()) caf::anon_send(reducer, actors::ready_atom::value, param);
      return;
  }
}

void Engine::Impl::on_backward_end() {
  if (micro->reducing()) {
    end_reduction();
  } else if (spec->fp32_grad_accumulation && spec->gradient_mode() == zero::GradientMode::all_reduce) {
    // A backward that reduces nothing: its low-precision gradients go into the fp32 accumulators
    // now (a reducing backward's are folded bucket by bucket by the reducer).
    actors::checked(actors::ask<actors::Done>(reducer, bound(), "gradient-reducer (fold)", actors::fold_atom::value));
  }
  if (stage3) stage3->backward_ended();
  micro->end_backward();
}

void Engine::backward(const at::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1)
    throw Error("backward: the loss must be a scalar tensor (got " +
                (loss.defined() ? std::to_string(loss.numel()) + " elements" : std::string("undefined")) + ")");
  if (!loss.requires_grad()) throw Error("backward: the loss does not require grad (was it computed under no_grad?)");
  scale(loss).backward();
  impl_->micro->end_backward();
}

at::Tensor Engine::scale(const at::Tensor& loss) {
  auto& s = *impl_;
  s.rethrow_pending();
  s.refuse_in_inference("backward");
  s.require_resident("backward");
  s.refuse_after_broken_update("backward");
  if (!s.gradients_attached())
    throw Error("backward: a parameter's .grad was replaced or reset outside the engine; use engine.zero_grad()");
  if (s.micro->arm_backward()) s.start_reduction(Impl::Trigger::armed);
  const auto gas = s.settings.gradient_accumulation_steps;
  at::Tensor scaled = gas > 1 ? loss / double(gas) : loss;
  // DeepSpeed scales the fp32 loss: (loss / gas).float() * scale.
  if (s.scaler) scaled = scaled.to(at::kFloat) * s.scaler->scale();
  return scaled;
}

void Engine::step() {
  auto& s = *impl_;
  s.rethrow_pending();
  s.refuse_in_inference("step");
  s.require_resident("step");
  s.refuse_after_broken_update("step");
  if (s.stage3 && s.stage3->pinned())
    throw Error("step: called inside gathered_parameters(); end the scope first (the gathered copies would not see "
                "the update)");
  if (s.update_started) {
    // The update has begun: a backward that did not finish (it raised) or a second one in this
    // micro-step leaves sub-groups whose gradients can never be final, and what was updated stays.
    const char* cause = s.micro->backward_unfinished() ? "the boundary backward did not finish (it raised)"
                        : s.micro->two_boundary_backwards() ? "a second backward ran in the boundary micro-step"
                                                          : nullptr;
    if (cause) {
      s.update_started = false;
      s.update_broken = std::string(cause) + " after the optimizer's update had begun during it "
                        "(tessera.offload.optimizer_during_backward)";
      s.refuse_after_broken_update("step");
    }
  }
  if (!s.micro->begin_step(s.scaler.has_value())) return;
  if (s.stage3) s.stage3->release_all();  // a unit kept gathered would not see the update
  const double snapshot_wait_s = s.wait_for_snapshot();  // an asynchronous save copies what the update changes
  actors::StepRequest request;
  request.hyperparameters = s.hyperparameters();
  request.max_grad_norm = s.settings.max_grad_norm;
  request.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
  const bool finishes_early_update = std::exchange(s.update_started, false);
  actors::StepReport report;
  bool partly_updated = false;
  try {
    if (finishes_early_update)  // the optimizer-shard updates what is final; now everything is
      actors::checked(actors::ask<actors::Done>(s.reducer, s.bound(), "step: the gradient-reducer (settle)", actors::settle_atom::value));
    report = actors::ask<actors::StepReport>(s.optimizer_shard, s.bound(), "step: the optimizer-shard",
                                             actors::step_atom::value, request);
    partly_updated = report.error && report.sub_groups_updated > 0;
    actors::checked(report);
  } catch (const std::exception& e) {
    // A step that failed before any sub-group moved leaves the engine as it was (it can be retried
    // or saved); one that failed part-way leaves masters, states and weights of two steps.
    if (partly_updated)
      s.update_broken = "step " + std::to_string(s.global) + " failed after " + std::to_string(report.sub_groups_updated) +
                        " of this rank's " + std::to_string(report.sub_groups) + " sub-groups were updated (" + e.what() + ")";
    else if (finishes_early_update)
      s.update_broken = std::string("step ") + std::to_string(s.global) + " failed (" + e.what() + ")";
    throw;
  }
  s.last_grad_norm = report.grad_norm;
  if (!report.overflow) {
    s.last_lrs.clear();
    for (const auto& hp : request.hyperparameters) s.last_lrs.push_back(hp.lr);
  }
  s.timing = StepTiming{report.reduction_wait_s, report.update_s, report.gather_s, report.offload_wait_s, report.offload_copy_s};
  s.timing.checkpoint_snapshot_wait_s = snapshot_wait_s;
  const auto& w = report.swap;
  s.timing.swap = {w.bytes_read, w.bytes_written, w.prefetched, w.waited_reads, w.read_wait_s, w.write_wait_s};
  s.timing.updated_before_step = report.final_before_step;
  if (report.overflow) ++s.skipped;
  if (s.scaler) {
    const auto update = s.scaler->update(report.overflow);
    if (report.overflow && s.spec->rank == 0)
      log::warn("step " + std::to_string(s.global) + ": " + update.describe() + " (skipped steps: " +
                std::to_string(s.skipped) + ")");
  }
  ++s.global;
  s.micro->updated();
  if (!s.config.tessera.checkpoint.sigterm_save_dir.empty()) save_and_exit_after_sigterm();
}

void Engine::zero_grad() {
  auto& s = *impl_;
  s.refuse_in_inference("zero_grad");
  s.require_resident("zero_grad");
  s.refuse_after_broken_update("zero_grad");
  if (s.update_started)
    throw Error("zero_grad: the update began during this boundary backward (tessera.offload.optimizer_during_backward) "
                "and cannot be undone; call step() to finish it");
  // The reducer finishes what it issued first (reductions may still be writing the gradients).
  actors::checked(actors::ask<actors::Done>(s.reducer, s.bound(), "zero_grad: the gradient-reducer", actors::zero_atom::value));
  s.micro->zero_grad();
}

Engine::Scope Engine::no_sync() {
  auto* s = impl_.get();
  s->micro->enter_no_sync();
  return Scope([s] { s->micro->exit_no_sync(); });
}

Engine::Scope Engine::coalesce_grad_reduction() {
  auto* s = impl_.get();
  s->micro->enter_coalesce();
  return Scope([s] {
    // One pass over the accumulated gradients: every bucket, in order, once.
    if (s->micro->exit_coalesce()) {
      s->start_reduction(Impl::Trigger::coalesced);
      if (s->reduces_gradients()) s->end_reduction();
      s->micro->end_backward();
    }
  });
}

bool Engine::is_gradient_accumulation_boundary() const { return impl_->micro->boundary(); }
double Engine::get_lr(size_t group) const {
  if (group >= impl_->groups.size())
    throw Error("get_lr: param group " + std::to_string(group) + " of " + std::to_string(impl_->groups.size()));
  return impl_->hyperparameters()[group].lr;
}
std::vector<double> Engine::get_lrs() const {
  std::vector<double> out;
  for (const auto& hp : impl_->hyperparameters()) out.push_back(hp.lr);
  return out;
}
size_t Engine::num_param_groups() const { return impl_->groups.size(); }
std::vector<std::string> Engine::param_group_names(size_t group) const {
  std::vector<std::string> out;
  for (int64_t i : impl_->groups.at(group).params) out.push_back(impl_->names[size_t(i)]);
  return out;
}
optim::OptimizerOptions Engine::param_group_options(size_t group) const { return impl_->groups.at(group).options; }
void Engine::set_lr(double lr, std::optional<size_t> group) {
  auto& s = *impl_;
  if (s.settings.has_scheduler)
    throw Error("set_lr: the config's scheduler sets the learning rate; remove the `scheduler` section to set it by hand");
  if (group && *group >= s.groups.size())
    throw Error("set_lr: param group " + std::to_string(*group) + " of " + std::to_string(s.groups.size()));
  if (!(lr >= 0)) throw Error("set_lr: lr = " + std::to_string(lr) + " must be >= 0");
  for (size_t g = 0; g < s.groups.size(); ++g) {
    if (group && *group != g) continue;
    s.groups[g].options.lr = lr;
    s.schedules[g] = optim::LrSchedule(actors::group_schedule(s.settings, s.groups[g].options));
  }
}
bool Engine::has_scheduler() const { return impl_->settings.has_scheduler; }
int64_t Engine::last_batch_iteration() const { return impl_->last_batch_iteration(); }
std::vector<double> Engine::last_lrs() const { return impl_->last_lrs; }

Engine::Scope Engine::autocast() {
  auto guard = std::make_shared<actors::AutocastGuard>(impl_->settings.autocast, at::kBFloat16);
  return Scope([guard]() mutable { guard.reset(); });
}
Engine::Scope Engine::forward_scope() {
  impl_->rethrow_pending();
  auto autocast_scope = std::make_shared<Scope>(autocast());
  auto stage3 = impl_->stage3;
  if (stage3) stage3->begin_forward();
  return Scope([autocast_scope, stage3]() mutable {
    if (stage3) stage3->end_forward();
    autocast_scope.reset();
  });
}
int64_t Engine::global_steps() const { return impl_->global; }
int64_t Engine::micro_steps() const { return impl_->micro->micro(); }
int64_t Engine::skipped_steps() const { return impl_->skipped; }
double Engine::loss_scale() const { return impl_->scaler ? impl_->scaler->scale() : 1.0; }
double Engine::last_grad_norm() const { return impl_->last_grad_norm; }
StepTiming Engine::last_step_timing() const { return impl_->timing; }

void Engine::train() { impl_->module->train(true); }
void Engine::eval() { impl_->module->eval(); }
std::shared_ptr<torch::nn::Module> Engine::module() const { return impl_->module; }
const config::Config& Engine::config() const { return impl_->config; }
int Engine::rank() const { return impl_->spec->rank; }
int Engine::world_size() const { return impl_->spec->world; }

}  // namespace tessera
