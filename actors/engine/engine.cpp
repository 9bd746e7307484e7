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

namespace {

// The two data-parallel communicators, one per issuing actor (gradients, parameters), each
// connected and passed through a barrier before anyone goes on: a rank that leaves while a peer
// is still in its connection handshake breaks that peer's connect.
std::pair<std::shared_ptr<transport::Communicator>, std::shared_ptr<transport::Communicator>> data_parallel_comms(
    const std::shared_ptr<transport::Communicator>& world, const std::string& name, int rank, int size,
    const actors::EngineSettings& settings, bool cuda, int device) {
  if (size == 1) return {nullptr, nullptr};
  std::shared_ptr<transport::Communicator> grad, param;
  if (world) {
    std::vector<int> all(size_t(world->size()));
    for (int r = 0; r < world->size(); ++r) all[size_t(r)] = r;
    grad = world->group(all, name + ".grad");
    param = world->group(all, name + ".param");
  } else {
    transport::CommunicatorOptions co;
    co.timeout = std::chrono::milliseconds(settings.collective_timeout_ms);
    co.name = name + ".grad";
    grad = cuda ? transport::Communicator::nccl(actors::job_store(), rank, size, device, co)
                : transport::Communicator::gloo(actors::job_store(), rank, size, co);
    co.name = name + ".param";
    param = cuda ? transport::Communicator::nccl(actors::job_store(), rank, size, device, co)
                 : transport::Communicator::gloo(actors::job_store(), rank, size, co);
  }
  grad->barrier()->wait();
  param->barrier()->wait();
  return {grad, param};
}

// The parameters the engine takes, in named_parameters order: those that require grad (every one
// for ZeRO inference). A tensor registered by two modules (tied weights) is one parameter, under
// its first name (as Python's Module.parameters() gives it once).
std::vector<std::pair<std::string, at::Tensor>> trainable_parameters(torch::nn::Module& model, bool inference) {
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  std::set<const c10::TensorImpl*> seen;
  for (auto& item : model.named_parameters())
    if ((inference || item.value().requires_grad()) && seen.insert(item.value().unsafeGetTensorImpl()).second)
      trainable.emplace_back(item.key(), item.value());
  if (trainable.empty())
    throw Error(inference ? "initialize: the model has no parameters" : "initialize: the model has no parameter that requires grad");
  return trainable;
}

// Refuses, naming the parameter, what the engine cannot take: a chunk cut for another stage or
// rank, a parameter a ZeRO-3 engine released, another dtype, another device.
void check_parameters(const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                      const actors::EngineSettings& settings, at::ScalarType dtype, int rank, int size) {
  const auto device = trainable.front().second.device();
  for (const auto& [name, p] : trainable) {
    // A parameter cut by partitioned construction is this rank's chunk (stage 3 only, same world).
    if (const auto chunk = zero::constructed_chunk(p)) {
      if (settings.stage != 3)
        throw ConfigError("initialize: parameter '" + name + "' was cut by partitioned construction "
                          "(PartitionedConstruction), which only ZeRO stage 3 takes (zero_optimization.stage is " +
                          std::to_string(settings.stage) + ")");
      if (chunk->world != size || chunk->rank != rank)
        throw Error("initialize: parameter '" + name + "' was cut for rank " + std::to_string(chunk->rank) + " of " +
                    std::to_string(chunk->world) + ", but this is rank " + std::to_string(rank) + " of " + std::to_string(size));
      continue;
    }
    // A parameter a ZeRO-3 engine released has its shape but no memory (and would crash a copy).
    if (p.numel() > 0 && (!p.has_storage() || p.storage().data() == nullptr))
      throw Error("initialize: parameter '" + name + "' has no memory: a ZeRO-3 engine released it (is the model still "
                  "held by another engine, or was its engine destroyed?). Build the model anew, or read it inside the "
                  "other engine's gathered_parameters()");
    if (p.scalar_type() != at::kFloat && p.scalar_type() != dtype)
      throw Error("initialize: parameter '" + name + "' is " + std::string(c10::toString(p.scalar_type())) +
                  "; the engine takes fp32 (or " + c10::toString(dtype) + ") parameters and converts them");
    if (p.device() != device || !(device.is_cpu() || device.is_cuda()))
      throw Error("initialize: parameter '" + name + "' is on " + p.device().str() + " but '" + trainable.front().first +
                  "' on " + device.str() + "; the engine takes the parameters of one CPU or CUDA device");
  }
}

// The sharding plan: every layout, once, from the config's sizes.
std::shared_ptr<const zero::ShardingPlan> sharding_plan(const actors::EngineSettings& settings, int size,
                                                        const std::vector<zero::PlannedParameter>& planned) {
  zero::ShardingPlanOptions options;
  options.stage = settings.stage;
  options.world = size;
  options.bucket_elements = settings.reduce_bucket_elements;  // 0: one bucket per parameter, as DeepSpeed
  options.sub_group_elements = std::max<int64_t>(1, settings.sub_group_elements);
  options.persistence_threshold = settings.persistence_threshold;
  return std::make_shared<const zero::ShardingPlan>(planned, options);
}

// ZeRO-3: the module of each unit (and the Sequential entries to bracket), refused when a module
// already belongs to another live engine.
actors::Stage3UnitModules free_unit_modules(torch::nn::Module& model, const zero::ShardingPlan& plan) {
  auto found = actors::stage3_unit_modules(model, plan);
  for (size_t u = 0; u < found.modules.size(); ++u)
    if (zero::is_unit(found.modules[u]))
      throw Error("initialize: ZeRO-3: module '" + plan.units()[u].module +
                  "' is a unit of another live engine; each module can belong to one engine");
  return found;
}

// The facts every actor of the engine shares, from the settings (the config's values) and the plan.
std::shared_ptr<actors::EngineSpec> engine_spec(const actors::EngineSettings& settings,
                                                std::shared_ptr<const zero::ShardingPlan> plan, at::ScalarType dtype,
                                                c10::Device device, int rank, int size, bool inference) {
  auto spec = std::make_shared<actors::EngineSpec>();
  spec->plan = std::move(plan);
  spec->dtype = dtype;
  spec->device = device;
  spec->fp16 = settings.precision == actors::Precision::fp16;
  spec->fp32_master = settings.fp32_master;
  spec->fp32_grad_accumulation = settings.fp32_grad_accumulation;
  spec->overlap_comm = settings.overlap_comm;
  spec->rank = rank;
  spec->world = size;
  spec->timeout = std::chrono::milliseconds(settings.collective_timeout_ms);
  spec->prefetch_elements = settings.prefetch_elements;
  spec->max_live_elements = settings.max_live_elements;
  spec->max_reuse_elements = settings.max_reuse_elements;
  spec->forward_windows = inference;
  spec->autocast_gathers = settings.stage == 3 && settings.autocast;
  return spec;
}

// ZeRO-3's storage: the parameters become views of unit storages and this rank keeps its pieces.
// Parameters cut at construction get their values from every rank's chunks, gathered one at a
// time on the parameter communicator (the user's thread: the parameter-shard does not exist yet).
std::unique_ptr<zero::Stage3Parameters> stage3_storage(const zero::ShardingPlan& plan, int rank, int size,
                                                       const std::vector<at::Tensor>& parameters, at::ScalarType dtype,
                                                       const std::shared_ptr<transport::Communicator>& param_comm) {
  zero::Stage3Parameters::Fill gather_chunks = [&](int64_t i, const at::Tensor& view) {
    const auto chunk = zero::constructed_chunk(parameters[size_t(i)]);
    if (!chunk) return false;
    auto whole = at::empty({chunk->chunk.numel() * size}, chunk->chunk.options());
    if (param_comm) param_comm->all_gather(chunk->chunk, whole)->wait();
    else whole.copy_(chunk->chunk);
    view.reshape({-1}).copy_(whole.narrow(0, 0, chunk->numel));
    return true;
  };
  auto storage = std::make_unique<zero::Stage3Parameters>(plan, rank, parameters, dtype, gather_chunks);
  for (const auto& p : parameters) zero::forget_constructed(p);
  return storage;
}

}  // namespace

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
  // ZeRO inference (DeepSpeed's, as Accelerate's prepare(model) gives it): no optimizer and no
  // client optimizer: stage 3 partitions every parameter and the engine only runs forwards.
  const bool inference = !settings.optimizer && !options.optimizer && options.param_groups.empty();
  if (inference && settings.stage != 3)
    throw ConfigError("optimizer: the engine needs an `optimizer` section (type and params) or a client optimizer; "
                      "without one it is a ZeRO inference engine, which needs zero_optimization.stage = 3 (it is " +
                      std::to_string(settings.stage) + ")");
  if (inference && settings.has_scheduler)
    throw ConfigError("scheduler: a ZeRO inference engine (no optimizer) has no learning rate to schedule");
  auto trainable = trainable_parameters(*model, inference);
  const at::ScalarType dtype = settings.precision == actors::Precision::bf16   ? at::kBFloat16
                               : settings.precision == actors::Precision::fp16 ? at::kHalf
                                                                               : at::kFloat;
  const auto device = trainable.front().second.device();
  check_parameters(trainable, settings, dtype, rank, size);
  std::vector<actors::ResolvedGroup> groups;
  if (inference) {
    groups.resize(1);
    for (size_t i = 0; i < trainable.size(); ++i) groups[0].params.push_back(int64_t(i));
  } else {
    groups = actors::resolve_groups(trainable, options.param_groups, options.optimizer.get(), settings.optimizer);
  }
  std::vector<optim::LrSchedule> schedules;
  std::vector<std::shared_ptr<optim::OptimizerKernel>> group_kernels;
  for (size_t g = 0; g < groups.size() && !inference; ++g) {
    groups[g].options.bf16_states = settings.bf16_optimizer_states;
    if (groups[g].client_step)
      group_kernels.push_back(std::make_shared<actors::ClientStepKernel>(options.optimizer, g, groups[g].options));
    else
      group_kernels.push_back(optim::make_optimizer_kernel(groups[g].options));  // validates (ConfigError naming the field)
    schedules.emplace_back(actors::group_schedule(settings, groups[g].options));
  }
  std::vector<std::string> names;
  for (const auto& item : trainable) names.push_back(item.first);
  std::vector<bool> lower(trainable.size(), false);
  if (settings.autocast) lower = actors::lower_precision_parameters(*model, names, settings.lower_precision_safe_modules);
  std::optional<optim::LossScaler> scaler;
  if (settings.precision == actors::Precision::fp16) scaler.emplace(settings.loss_scaler);
  // The sharding plan: every layout, once.
  std::vector<zero::PlannedParameter> planned(trainable.size());
  for (size_t g = 0; g < groups.size(); ++g)
    for (int64_t i : groups[g].params)
      planned[size_t(i)] = {names[size_t(i)], trainable[size_t(i)].second.sizes().vec(), int64_t(g), bool(lower[size_t(i)])};
  const bool stage3 = settings.stage == 3;
  if (stage3) actors::assign_stage3_units(*model, trainable, actors::stage3_leaf_modules(*model, resolved), planned);
  auto plan = sharding_plan(settings, size, planned);
  std::vector<const torch::nn::Module*> units;
  std::unique_ptr<zero::SequentialUnits> sequential_units;
  if (stage3) {
    auto found = free_unit_modules(*model, *plan);
    units = std::move(found.modules);
    sequential_units = std::move(found.sequential);
  }

  // 2. The data-parallel communicators.
  const std::string comm_name = size == 1 ? "" : world ? world->name() : actors::next_communicator_name("engine");
  auto [grad_comm, param_comm] =
      data_parallel_comms(world, comm_name, rank, size, settings, device.is_cuda(), device.is_cuda() ? device.index() : -1);

  // 3. Flat buffers, actors, hooks.
  auto spec = engine_spec(settings, plan, dtype, device, rank, size, inference);
  if (!groups.empty() && groups.front().client_step) actors::detach_client_parameters(*options.optimizer);
  std::vector<std::unique_ptr<zero::FlatParameters>> flat;
  std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels;
  std::vector<at::Tensor> partitions, parameters;
  for (const auto& [name, p] : trainable) parameters.push_back(p);
  std::unique_ptr<zero::Stage3Parameters> stage3_parameters;
  if (stage3) {
    stage3_parameters = stage3_storage(*plan, rank, size, parameters, dtype, param_comm);
    for (size_t g = 0; g < plan->groups().size(); ++g) {
      partitions.push_back(stage3_parameters->partition(int64_t(g)));
      if (!inference) kernels.push_back(group_kernels[size_t(plan->groups()[g].param_group)]);
    }
  }
  for (const auto& group : plan->groups()) {
    if (stage3) break;
    std::vector<std::pair<std::string, at::Tensor>> members;
    for (int64_t i : group.params) members.push_back(trainable[size_t(i)]);
    flat.push_back(std::make_unique<zero::FlatParameters>(members, group.layout, dtype));
    partitions.push_back(flat.back()->partition(plan->owned_partition(rank)));
    kernels.push_back(group_kernels[size_t(group.param_group)]);
  }
  auto impl = std::make_unique<Engine::Impl>();
  impl->module = model;
  impl->config = resolved;
  impl->settings = settings;
  impl->spec = spec;
  impl->groups = groups;
  impl->schedules = std::move(schedules);
  impl->scaler = scaler;
  impl->names = names;
  impl->world = world;
  impl->comm_name = comm_name;
  // ZeRO-3 reduces every micro-step (into the partition, as stage 2 does), even on one rank.
  impl->micro = std::make_unique<actors::MicroSteps>(settings.gradient_accumulation_steps,
                                                     plan->staged_gradients(), size > 1 || stage3);
  if (plan->gradient_mode() == zero::GradientMode::reduce_to_owner)
    impl->staging = std::make_shared<actors::BucketStaging>(spec, parameters);
  impl->inference = inference;
  impl->sequential_units = std::move(sequential_units);
  if (stage3 && !inference) impl->unit_staging = std::make_shared<actors::UnitGradStaging>(spec, parameters);
  if (!inference)
    impl->reducer = actors::spawn_gradient_reducer(spec, parameters, flat, impl->staging, impl->unit_staging, grad_comm);
  if (plan->gradient_mode() == zero::GradientMode::all_reduce)
    for (const auto& p : parameters) impl->grad_views.emplace_back(p, p.grad().data_ptr());
  impl->parameter_shard = stage3 ? actors::spawn_stage3_parameter_shard(spec, std::move(stage3_parameters), param_comm)
                                 : actors::spawn_parameter_shard(spec, std::move(flat), param_comm);
  if (stage3) {
    impl->stage3 = std::make_shared<actors::Stage3Driver>(spec, impl->parameter_shard, impl->unit_staging, impl->bound());
    zero::register_units(impl->stage3, units);
  }
  if (!inference)
    impl->optimizer_shard =
        actors::spawn_optimizer_shard(spec, std::move(kernels), partitions, impl->reducer, impl->parameter_shard);
  auto* raw = impl.get();
  if (!inference)
    impl->hooks = std::make_unique<zero::GradReadyHooks>(
        parameters, [raw](int64_t i) { raw->on_grad_ready(i); }, [raw] { raw->on_backward_end(); });
  for (const auto& hp : impl->hyperparameters()) impl->last_lrs.push_back(hp.lr);
  if (rank == 0) {
    for (const auto& warning : resolved.warnings) log::warn("config: " + warning);
  }
  if (!resolved.tessera.checkpoint.sigterm_save_dir.empty()) install_sigterm_flag();
  Initialized out;
  out.engine = std::make_shared<Engine>(std::move(impl));
  out.optimizer = std::make_shared<EngineOptimizer>(out.engine);
  if (settings.has_scheduler) out.lr_scheduler = std::make_shared<EngineScheduler>(out.engine);
  return out;
}

void Engine::Impl::on_grad_ready(int64_t param) {
  bool reduces = false;
  if (micro->arm_from_hook(reduces) && reduces) start_reduction();
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
  if (!s.gradients_attached())
    throw Error("backward: a parameter's .grad was replaced or reset outside the engine; use engine.zero_grad()");
  if (s.micro->arm_backward()) s.start_reduction();
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
  if (s.stage3 && s.stage3->pinned())
    throw Error("step: called inside gathered_parameters(); end the scope first (the gathered copies would not see "
                "the update)");
  if (!s.micro->begin_step(s.scaler.has_value())) return;
  if (s.stage3) s.stage3->release_all();  // a unit kept gathered would not see the update
  actors::StepRequest request;
  request.hyperparameters = s.hyperparameters();
  request.max_grad_norm = s.settings.max_grad_norm;
  request.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
  auto report = actors::checked(actors::ask<actors::StepReport>(s.optimizer_shard, s.bound(), "step: the optimizer-shard",
                                                                actors::step_atom::value, request));
  s.last_grad_norm = report.grad_norm;
  if (!report.overflow) {
    s.last_lrs.clear();
    for (const auto& hp : request.hyperparameters) s.last_lrs.push_back(hp.lr);
  }
  s.timing = StepTiming{report.reduction_wait_s, report.update_s, report.gather_s};
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
      s->start_reduction();
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
