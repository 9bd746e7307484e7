#include "actors/engine.h"

#include <caf/all.hpp>
#include <torch/nn/module.h>

#include <ATen/ATen.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "actors/actor_runtime.h"
#include "actors/autocast.h"
#include "actors/bucket_staging.h"
#include "actors/client_optimizer.h"
#include "actors/group_resolution.h"
#include "actors/detail/engine_shared.h"
#include "actors/engine_settings.h"
#include "actors/gradient_reducer.h"
#include "actors/optimizer_shard.h"
#include "actors/parameter_shard.h"
#include "actors/protocol.h"
#include "actors/storage_description.h"
#include "core/error.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/zero/grad_ready_hooks.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace tessera {

using actors::ResolvedGroup;

struct Engine::Impl {
  std::shared_ptr<torch::nn::Module> module;
  config::Config config;
  actors::EngineSettings settings;
  std::shared_ptr<actors::detail::EngineShared> shared;
  std::unique_ptr<zero::GradReadyHooks> hooks;
  std::vector<ResolvedGroup> groups;            // the user's parameter groups
  std::vector<optim::LrSchedule> schedules;     // per parameter group
  caf::actor reducer, parameter_shard, optimizer_shard;
  std::optional<optim::LossScaler> scaler;  // fp16
  // Per flat group; owned by the optimizer shard, read between steps (storage maps).
  std::vector<std::shared_ptr<optim::FlatOptimizer>> optimizers;
  std::vector<double> last_lrs;             // of the last update
  std::atomic<bool> reducing{false};        // this backward's gradients go to the reducer
  std::atomic<bool> armed{false};           // a backward through backward()/scale() is expected
  std::atomic<bool> unarmed_backward{false};  // a backward ran that the engine did not scale
  int64_t micro = 0, global = 0, skipped = 0;
  int boundary_backwards = 0;  // reducing backwards in the current boundary micro-step
  int no_sync_depth = 0;
  bool coalescing = false;
  std::atomic<bool> double_boundary_backward{false};  // a second unscoped backward at a boundary
  double last_grad_norm = -1;
  StepTiming timing;
  std::shared_ptr<actors::BucketStaging> staging;  // partitioned gradients: the current backward's buckets

  bool boundary() const { return (micro + 1) % settings.gradient_accumulation_steps == 0; }
  // DeepSpeed steps the scheduler only after updates that were not skipped.
  int64_t last_batch_iteration() const { return global - skipped - 1 + settings.schedule_offset; }
  // The hyperparameters of the next update, per parameter group.
  std::vector<optim::StepHyperparameters> hyperparameters() const {
    std::vector<optim::StepHyperparameters> out;
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& o = groups[g].options;
      optim::StepHyperparameters hp{o.lr, o.beta1, o.beta2};
      const auto v = schedules[g].at(last_batch_iteration());
      hp.lr = v.lr;
      if (v.beta1) hp.beta1 = *v.beta1;
      if (v.beta2) hp.beta2 = *v.beta2;
      out.push_back(hp);
    }
    return out;
  }
  bool gradients_attached() const {
    for (const auto& g : shared->groups)
      if (!g.flat->gradients_attached()) return false;
    return true;
  }
  void zero_flat_grads() {
    for (auto& g : shared->groups) {
      g.flat->zero_grad();
      if (g.accum.defined()) g.accum.zero_();
      if (g.reduced.defined()) g.reduced.zero_();
    }
  }
  // Waits for every reduction issued so far (and runs their finishers: partitioned gradients are
  // added into the reduced partitions). From any thread but the reducer's.
  void drain() {
    caf::scoped_actor self{actors::actor_system()};
    actors::WorkList issued;
    std::string failure;
    self->request(reducer, std::chrono::milliseconds(settings.collective_timeout_ms), actors::collect_atom::value)
        .receive([&](actors::WorkList& w) { issued = std::move(w); },
                 [&](caf::error& e) { failure = actors::actor_system().render(e); });
    if (!failure.empty()) throw Error("gradient-reducer did not hand over its reductions: " + failure);
    if (issued.error) std::rethrow_exception(issued.error);
    issued.wait_all();
  }
  // After a backward that reduces nothing: its low-precision gradients go into the fp32
  // accumulators (a reducing backward's are folded bucket by bucket by the reducer).
  void fold_all() {
    for (auto& g : shared->groups)
      if (g.accum.defined()) g.fold(0, g.flat->layout().padded_numel);
  }
  // Whether a backward now must reduce: outside no_sync and coalesce blocks, at a boundary (with
  // partitioned gradients: at every backward, each adding into the reduced partitions).
  bool reduces_now() const {
    return (shared->partitioned_gradients || boundary()) && no_sync_depth == 0 && !coalescing;
  }
  // A second reduction in one boundary micro-step would average already averaged gradients in
  // the flat buffer; partitioned gradients add up instead.
  bool refuses_second_reduction() const { return !shared->partitioned_gradients && boundary_backwards > 0; }
  void start_reduction() {
    ++boundary_backwards;
    if (shared->world > 1) {
      staging = shared->partitioned_gradients ? std::make_shared<actors::BucketStaging>(shared) : nullptr;
      reducing = true;
      caf::anon_send(reducer, actors::begin_atom::value, staging);
    }
  }
  // The end of a reducing backward: with partitioned gradients the parameters autograd did not
  // report (unused here, or accumulated in no_sync) are staged too; then every bucket is issued.
  void end_reduction() {
    if (staging) staging->take_rest();
    staging = nullptr;
    caf::anon_send(reducer, actors::flush_atom::value);
  }
  // Called before every backward the engine knows of: checks, then arms the reduction.
  void arm_backward() {
    const bool reduce = reduces_now();
    if (reduce && refuses_second_reduction())
      throw Error("backward: called twice in the micro-step that ends gradient accumulation (micro-step " +
                  std::to_string(micro) + "); reduce once per boundary: call step() in between, or wrap the "
                  "backwards in coalesce_grad_reduction()");
    if (!gradients_attached())
      throw Error("backward: a parameter's .grad was replaced or reset outside the engine; use engine.zero_grad()");
    armed = true;
    if (reduce) start_reduction();
  }
  // A backward the engine was not told of (loss.backward() on a joint loss): armed from the
  // first gradient hook, on autograd's thread; problems are reported by the next step().
  void arm_from_hook() {
    unarmed_backward = true;
    if (!reduces_now()) return;
    if (refuses_second_reduction()) {
      double_boundary_backward = true;
      return;
    }
    start_reduction();
  }
  ~Impl() {
    hooks.reset();  // disarm before the actors go
    for (auto* a : {&reducer, &parameter_shard, &optimizer_shard})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Initialized initialize(std::shared_ptr<torch::nn::Module> model, const config::Config& config,
                       const InitializeOptions& options) {
  if (!model) throw Error("initialize: the model is null");
  // 1. Everything that can be wrong is checked before the model changes.
  auto world = options.world;
  int rank = 0, size = 1;
  if (world) {
    rank = world->rank(), size = world->size();
  } else {
    const auto env = transport::LaunchEnv::from_env();
    rank = env.rank, size = env.world_size;
  }
  auto facts = options.facts;
  facts.world_size = size;
  auto resolved = config::resolve_for_engine(config, facts);
  auto settings = actors::engine_settings(resolved);
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  for (auto& item : model->named_parameters())
    if (item.value().requires_grad()) trainable.emplace_back(item.key(), item.value());
  if (trainable.empty()) throw Error("initialize: the model has no parameter that requires grad");
  const at::ScalarType dtype = settings.precision == actors::Precision::bf16   ? at::kBFloat16
                               : settings.precision == actors::Precision::fp16 ? at::kHalf
                                                                               : at::kFloat;
  for (const auto& [name, p] : trainable)
    if ((p.scalar_type() != at::kFloat && p.scalar_type() != dtype) || !p.device().is_cpu())
      throw Error("initialize: parameter '" + name + "' is " + std::string(c10::toString(p.scalar_type())) + " on " +
                  p.device().str() + "; the engine takes fp32 (or " + c10::toString(dtype) +
                  ") CPU parameters and converts them");
  auto groups = actors::resolve_groups(trainable, options.param_groups, options.optimizer.get(), settings.optimizer);
  std::vector<optim::LrSchedule> schedules;
  for (auto& g : groups) {
    g.options.bf16_states = settings.bf16_optimizer_states;
    if (!g.client_step) optim::make_flat_optimizer(g.options);  // validates (ConfigError naming the field)
    schedules.emplace_back(actors::group_schedule(settings, g.options));
  }
  std::vector<std::string> names;
  for (const auto& item : trainable) names.push_back(item.first);
  std::vector<bool> lower(trainable.size(), false);
  if (settings.autocast) lower = actors::lower_precision_parameters(*model, names, settings.lower_precision_safe_modules);
  std::optional<optim::LossScaler> scaler;
  if (settings.precision == actors::Precision::fp16) scaler.emplace(settings.loss_scaler);

  // 2. The data-parallel group.
  if (!world && size > 1) {
    transport::CommunicatorOptions co;
    co.name = actors::next_communicator_name("engine");
    co.timeout = std::chrono::milliseconds(settings.collective_timeout_ms);
    world = transport::Communicator::gloo(actors::job_store(), rank, size, co);
    // Nobody goes on (and perhaps exits) before every rank has finished connecting: a rank that
    // leaves while a peer is still in its connection handshake breaks that peer's connect.
    world->barrier()->wait();
  }

  // 3. Flat groups, buckets, actors, hooks.
  auto impl = std::make_unique<Engine::Impl>();
  impl->module = model;
  impl->config = resolved;
  impl->settings = settings;
  impl->groups = groups;
  impl->schedules = std::move(schedules);
  impl->scaler = scaler;
  auto shared = std::make_shared<actors::detail::EngineShared>();
  shared->stage = settings.stage;
  shared->dtype = dtype;
  shared->fp16 = settings.precision == actors::Precision::fp16;
  shared->fp32_master = settings.fp32_master;
  shared->overlap_comm = settings.overlap_comm;
  shared->rank = rank;
  shared->world = size;
  shared->dp = world;
  shared->timeout = std::chrono::milliseconds(settings.collective_timeout_ms);
  // DeepSpeed aligns partitions to 2 elements; stage 0 keeps one "partition" holding everything.
  shared->alignment = settings.stage >= 1 ? 2 : 1;
  shared->partitioned_gradients = settings.stage == 2 && size > 1;
  for (const auto& [name, p] : trainable) {
    shared->names.push_back(name);
    shared->shapes.push_back(p.sizes().vec());
    shared->parameters.push_back(p);
  }
  if (!groups.empty() && groups.front().client_step) actors::detach_client_parameters(*options.optimizer);
  std::vector<zero::FlatGroupLayout> layouts;
  std::vector<std::vector<int64_t>> model_index;
  for (size_t g = 0; g < groups.size(); ++g) {
    // With autocast, the group's lower-precision parameters form a flat group of their own.
    for (const bool low : {false, true}) {
      std::vector<std::pair<std::string, at::Tensor>> members;
      std::vector<int64_t> ids;
      for (int64_t i : groups[g].params)
        if (lower[i] == low) members.push_back(trainable[i]), ids.push_back(i);
      if (members.empty()) continue;
      actors::detail::FlatGroup group;
      group.flat = std::make_unique<zero::FlatParameters>(members, settings.stage >= 1 ? size : 1, shared->alignment,
                                                          dtype, /*flat_gradients=*/!shared->partitioned_gradients);
      group.params = ids;
      group.param_group = int64_t(g);
      group.comm_dtype = low ? at::kBFloat16 : dtype;
      if (shared->fp32_master) group.master = group.flat->partition(shared->owned_rank()).to(at::kFloat);
      if (settings.fp32_grad_accumulation) group.comm_dtype = at::kFloat;
      if (shared->partitioned_gradients) {
        group.reduced = at::zeros({group.flat->layout().partition_numel},
                                  settings.fp32_grad_accumulation ? at::kFloat : dtype);
      } else if (settings.fp32_grad_accumulation) {
        group.accum = at::zeros({group.flat->layout().padded_numel}, at::kFloat);
      }
      layouts.push_back(group.flat->layout());
      model_index.push_back(ids);
      if (groups[g].client_step)
        impl->optimizers.push_back(std::make_shared<actors::ClientStepOptimizer>(options.optimizer, g, groups[g].options));
      else
        impl->optimizers.push_back(optim::make_flat_optimizer(groups[g].options));
      shared->groups.push_back(std::move(group));
    }
  }
  shared->plan = zero::make_bucket_plan(
      layouts, model_index,
      settings.stage == 2 ? zero::BucketShape::reduce_scatter : zero::BucketShape::all_reduce,
      std::max<int64_t>(1, settings.reduce_bucket_elements));
  impl->shared = shared;
  auto& system = actors::actor_system();
  impl->reducer = actors::spawn_gradient_reducer(system, shared);
  impl->parameter_shard = actors::spawn_parameter_shard(system, shared);
  impl->optimizer_shard =
      actors::spawn_optimizer_shard(system, shared, impl->optimizers, impl->reducer, impl->parameter_shard);
  auto* raw = impl.get();
  caf::actor reducer = impl->reducer;
  impl->hooks = std::make_unique<zero::GradReadyHooks>(
      shared->parameters,
      [raw, reducer](int64_t i) {
        if (!raw->armed.exchange(true)) raw->arm_from_hook();
        if (!raw->reducing.load()) return;
        if (raw->staging) raw->staging->take(i);  // before the reducer hears of it (bucket_staging.h)
        caf::anon_send(reducer, actors::ready_atom::value, i);
      },
      [raw] {
        if (raw->reducing.load()) raw->end_reduction();
        else raw->fold_all();
        raw->reducing = false;
        raw->armed = false;
      });
  for (const auto& hp : impl->hyperparameters()) impl->last_lrs.push_back(hp.lr);
  if (rank == 0)
    for (const auto& warning : resolved.warnings) std::fprintf(stderr, "[tessera] config: %s\n", warning.c_str());
  Initialized out;
  out.engine = std::make_shared<Engine>(std::move(impl));
  out.optimizer = std::make_shared<EngineOptimizer>(out.engine);
  if (settings.has_scheduler) out.lr_scheduler = std::make_shared<EngineScheduler>(out.engine);
  return out;
}

void Engine::backward(const at::Tensor& loss) {
  auto& s = *impl_;
  if (!loss.defined() || loss.numel() != 1)
    throw Error("backward: the loss must be a scalar tensor (got " +
                (loss.defined() ? std::to_string(loss.numel()) + " elements" : std::string("undefined")) + ")");
  if (!loss.requires_grad()) throw Error("backward: the loss does not require grad (was it computed under no_grad?)");
  scale(loss).backward();
  s.reducing = false;
  s.armed = false;
}

at::Tensor Engine::scale(const at::Tensor& loss) {
  auto& s = *impl_;
  s.arm_backward();
  const auto gas = s.settings.gradient_accumulation_steps;
  at::Tensor scaled = gas > 1 ? loss / double(gas) : loss;
  // DeepSpeed scales the fp32 loss: (loss / gas).float() * scale.
  if (s.scaler) scaled = scaled.to(at::kFloat) * s.scaler->scale();
  return scaled;
}

void Engine::step() {
  auto& s = *impl_;
  if (!s.boundary()) {
    ++s.micro;
    return;
  }
  if (s.no_sync_depth > 0 || s.coalescing)
    throw Error(std::string("step: called inside ") + (s.coalescing ? "coalesce_grad_reduction()" : "no_sync()") +
                "; end the block first");
  if (s.double_boundary_backward)
    throw Error("step: two backwards ran in the micro-step that ends gradient accumulation; wrap them in "
                "coalesce_grad_reduction() (call zero_grad() and redo the micro-step)");
  if (s.scaler && s.unarmed_backward)
    throw Error("step: a backward ran on a loss the engine did not scale (fp16 needs engine.backward(loss) or "
                "engine.scale(loss).backward()); the gradients are wrong by the loss scale " +
                std::to_string(s.scaler->scale()) + ". Call zero_grad() and redo the micro-step");
  actors::StepRequest request;
  request.hyperparameters = s.hyperparameters();
  request.max_grad_norm = s.settings.max_grad_norm;
  request.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
  actors::StepReport report;
  bool answered = false;
  caf::scoped_actor self{actors::actor_system()};
  // Every collective inside has its own timeout; this bound only guards against a lost actor.
  const auto bound = std::chrono::milliseconds(3 * s.settings.collective_timeout_ms + 10000);
  self->request(s.optimizer_shard, bound, actors::step_atom::value, request)
      .receive([&](actors::StepReport& r) { report = std::move(r), answered = true; },
               [&](caf::error& e) {
                 report.error = std::make_exception_ptr(
                     Error("step: the optimizer shard did not answer: " + actors::actor_system().render(e)));
               });
  if (report.error) std::rethrow_exception(report.error);
  if (!answered) throw Error("step: no answer from the optimizer shard");
  s.last_grad_norm = report.grad_norm;
  if (!report.overflow) {
    s.last_lrs.clear();
    for (const auto& hp : request.hyperparameters) s.last_lrs.push_back(hp.lr);
  }
  s.timing = StepTiming{report.reduction_wait_s, report.update_s, report.gather_s};
  if (report.overflow) ++s.skipped;
  if (s.scaler) {
    const auto update = s.scaler->update(report.overflow);
    if (report.overflow && s.shared->rank == 0)
      std::fprintf(stderr, "[tessera] step %lld: %s (skipped steps: %lld)\n", static_cast<long long>(s.global),
                   update.describe().c_str(), static_cast<long long>(s.skipped));
  }
  s.unarmed_backward = false;
  s.double_boundary_backward = false;
  ++s.global;
  ++s.micro;
  s.boundary_backwards = 0;
  s.zero_flat_grads();
}

void Engine::zero_grad() {
  auto& s = *impl_;
  if ((s.boundary_backwards > 0 || s.shared->partitioned_gradients) && s.shared->world > 1) {
    // Reductions may still be writing into the gradients: finish them first.
    s.drain();
  }
  impl_->zero_flat_grads();
  impl_->unarmed_backward = false;
  impl_->double_boundary_backward = false;
  impl_->boundary_backwards = 0;
}

Engine::Scope Engine::no_sync() {
  auto* s = impl_.get();
  if (s->coalescing) throw Error("no_sync: cannot be used inside coalesce_grad_reduction()");
  ++s->no_sync_depth;
  return Scope([s] { --s->no_sync_depth; });
}

Engine::Scope Engine::coalesce_grad_reduction() {
  auto* s = impl_.get();
  if (s->no_sync_depth > 0) throw Error("coalesce_grad_reduction: cannot be nested inside no_sync()");
  if (s->coalescing) throw Error("coalesce_grad_reduction: already inside a coalesce_grad_reduction() block");
  s->coalescing = true;
  return Scope([s] {
    s->coalescing = false;
    // One pass over the accumulated gradients: every bucket, in order, once.
    if (s->reduces_now() && !s->refuses_second_reduction()) {
      s->start_reduction();
      if (s->shared->world > 1) s->end_reduction();
      s->reducing = false;
    }
  });
}
bool Engine::is_gradient_accumulation_boundary() const { return impl_->boundary(); }
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
  for (int64_t i : impl_->groups.at(group).params) out.push_back(impl_->shared->names[i]);
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
int64_t Engine::global_steps() const { return impl_->global; }
int64_t Engine::micro_steps() const { return impl_->micro; }
int64_t Engine::skipped_steps() const { return impl_->skipped; }
double Engine::loss_scale() const { return impl_->scaler ? impl_->scaler->scale() : 1.0; }
double Engine::last_grad_norm() const { return impl_->last_grad_norm; }
StepTiming Engine::last_step_timing() const { return impl_->timing; }

EngineMemory Engine::memory() const {
  auto bytes = [](const at::Tensor& t) { return t.defined() ? int64_t(t.numel() * t.element_size()) : int64_t(0); };
  EngineMemory m;
  const auto& s = *impl_->shared;
  for (const auto& g : s.groups) {
    m.parameters += bytes(g.flat->buffer());
    m.gradients += bytes(g.flat->grad_buffer()) + bytes(g.accum) + bytes(g.reduced);
    m.master += bytes(g.master);
    if (!g.flat->flat_gradients())
      for (const auto& p : g.flat->parameters()) m.gradients += bytes(p.grad());
  }
  for (const auto& o : impl_->optimizers)
    for (const auto& t : o->states()) m.optimizer_states += bytes(t);
  return m;
}

EngineStorage Engine::storage_maps() const {
  std::vector<std::vector<at::Tensor>> states;
  for (const auto& o : impl_->optimizers) states.push_back(o->states());
  return actors::describe_storage(*impl_->shared, impl_->optimizers.front()->state_names(), states);
}
void Engine::train() { impl_->module->train(true); }
void Engine::eval() { impl_->module->eval(); }
std::shared_ptr<torch::nn::Module> Engine::module() const { return impl_->module; }
const config::Config& Engine::config() const { return impl_->config; }
int Engine::rank() const { return impl_->shared->rank; }
int Engine::world_size() const { return impl_->shared->world; }

}  // namespace tessera
