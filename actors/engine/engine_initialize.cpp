// initialize(): the engine built in three named steps (docs/DESIGN.md §4.1): everything checked and
// planned before the model changes (prepare_engine), the data-parallel communicators, then the
// buffers, actors and hooks (assemble_engine).
#include "actors/engine/engine.h"

#include "actors/engine/engine_impl.h"
#include "actors/engine/sigterm_flag.h"

#include <caf/all.hpp>
#include <torch/nn/module.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>
#include <set>

#include "actors/actor_runtime.h"
#include "actors/bucket_staging.h"
#include "actors/client_optimizer.h"
#include "actors/engine/autocast.h"
#include "actors/engine/engine_settings.h"
#include "actors/engine/group_resolution.h"
#include "actors/engine/micro_steps.h"
#include "actors/engine/stage3_driver.h"
#include "actors/engine/stage3_units.h"
#include "actors/engine_spec.h"
#include "actors/gradient_reducer.h"
#include "actors/optimizer_shard.h"
#include "actors/parameter_shard.h"
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

namespace tessera {

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
    // The config's collective timeout, not the given world's (it may have been made with another).
    const std::chrono::milliseconds timeout(settings.collective_timeout_ms);
    grad = world->group(all, name + ".grad", timeout);
    param = world->group(all, name + ".param", timeout);
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
  if (settings.parameter_offload == config::OffloadDevice::cpu) {
    spec->weight_home = settings.parameter_offload_pin_memory ? zero::WeightHome::host_pinned : zero::WeightHome::host;
    // Beside a GPU two parts would need device copies of host buffers that do not exist yet: the
    // persistent parameters (views of the weight buffer) and a device optimizer stepping host partitions.
    if (device.is_cuda()) {
      for (const auto& segment : spec->plan->segments())
        if (segment.persistent())
          throw ConfigError("zero_optimization.offload_param.device = \"cpu\" on a GPU keeps persistent parameters in "
                            "host memory, which a GPU forward cannot read: not yet supported; set "
                            "zero_optimization.stage3_param_persistence_threshold = 0");
      if (settings.optimizer_offload != config::OffloadDevice::none && settings.optimizer_offload_ratio < 1.0 && !inference)
        throw ConfigError("zero_optimization.offload_param.device = \"cpu\" on a GPU with offload_optimizer.ratio < 1: the "
                          "device's share of the optimizer would update host partitions, which is not yet supported");
      if (settings.optimizer_offload == config::OffloadDevice::none && !inference)
        throw ConfigError("zero_optimization.offload_param.device = \"cpu\" on a GPU needs offload_optimizer.device "
                          "\"cpu\" or \"nvme\" (the update of host partitions by a device optimizer is not yet supported)");
    }
  }
  if (settings.parameter_offload == config::OffloadDevice::nvme) {
    // The device copies a GPU forward would read (persistent parameters, partitions for a device
    // optimizer) come from host memory, which has not run beside a GPU yet.
    if (device.is_cuda())
      throw ConfigError("zero_optimization.offload_param.device = \"nvme\" on a GPU: not yet supported (use \"cpu\")");
    spec->weight_home = zero::WeightHome::nvme;
    auto& swap = spec->parameter_swap;
    swap.path = settings.parameter_offload_nvme_path + "/tessera_parameters_rank" + std::to_string(rank) + ".swap";
    swap.chunk_bytes = settings.parameter_offload_buffer_size * int64_t(c10::elementSize(dtype));
    swap.buffers = settings.parameter_offload_buffer_count;  // >= 2 (engine_settings)
    swap.aio = settings.aio;
    swap.aio.timeout = spec->timeout;
  }
  if (settings.optimizer_offload != config::OffloadDevice::none) {
    const bool nvme = settings.optimizer_offload == config::OffloadDevice::nvme;
    spec->optimizer_offload.placement = nvme ? actors::StatePlacement::nvme : actors::StatePlacement::host;
    spec->optimizer_offload.pin_memory = settings.optimizer_offload_pin_memory;
    spec->optimizer_offload.buffer_count = settings.optimizer_offload_buffer_count;
    spec->optimizer_offload.nvme_path = settings.optimizer_offload_nvme_path;
    spec->optimizer_offload.aio = settings.aio;
    spec->optimizer_offload.aio.timeout = spec->timeout;
    spec->optimizer_offload.update = settings.optimizer_update;
    spec->optimizer_offload.ratio = settings.optimizer_offload_ratio;
    spec->optimizer_offload.threads = std::max(1, at::get_num_threads());
    spec->optimizer_offload.binding =
        transport::LaunchEnv::bound_cpu_list().empty() ? actors::CoreBinding::none : actors::CoreBinding::per_core;
    if (settings.optimizer_update == actors::UpdateTiming::during_backward && settings.stage == 2 && size == 1)
      throw ConfigError("tessera.offload.optimizer_during_backward: ZeRO stage 2 on one rank reduces nothing bucket by "
                        "bucket (its gradients are final only when backward ends); use it across ranks or at stage 3");
  }
  return spec;
}

// ZeRO-3's storage: the parameters become views of unit storages and this rank keeps its pieces.
// Parameters cut at construction get their values from every rank's chunks, gathered one at a
// time on the parameter communicator (the user's thread: the parameter-shard does not exist yet).
std::unique_ptr<zero::Stage3Parameters> stage3_storage(const zero::ShardingPlan& plan, int rank, int size,
                                                       const std::vector<at::Tensor>& parameters, at::ScalarType dtype,
                                                       const std::shared_ptr<transport::Communicator>& param_comm,
                                                       const actors::EngineSpec& spec) {
  zero::Stage3Parameters::Fill gather_chunks = [&](int64_t i, const at::Tensor& view) {
    const auto chunk = zero::constructed_chunk(parameters[size_t(i)]);
    if (!chunk) return false;
    auto whole = at::empty({chunk->chunk.numel() * size}, chunk->chunk.options());
    if (param_comm) param_comm->all_gather(chunk->chunk, whole)->wait();
    else whole.copy_(chunk->chunk);
    view.reshape({-1}).copy_(whole.narrow(0, 0, chunk->numel));
    return true;
  };
  std::optional<zero::ParameterSwapOptions> swap;
  if (spec.weight_home == zero::WeightHome::nvme) swap = spec.parameter_swap;
  auto storage = std::make_unique<zero::Stage3Parameters>(plan, rank, parameters, dtype, gather_chunks, spec.weight_home, swap);
  for (const auto& p : parameters) zero::forget_constructed(p);
  return storage;
}


// What prepare_engine has checked and derived: everything initialize needs before it makes a
// communicator or a buffer.
struct EngineSetup {
  std::shared_ptr<transport::Communicator> world;
  int rank = 0, size = 1;
  config::Config resolved;
  actors::EngineSettings settings;
  bool inference = false;  // ZeRO inference: no optimizer, forwards only
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  std::vector<std::string> names;
  at::ScalarType dtype = at::kFloat;
  c10::Device device{c10::kCPU};
  std::vector<actors::ResolvedGroup> groups;
  std::vector<optim::LrSchedule> schedules;
  std::vector<std::shared_ptr<optim::OptimizerKernel>> group_kernels;  // per user group
  std::optional<optim::LossScaler> scaler;
  std::shared_ptr<const zero::ShardingPlan> plan;
  actors::Stage3UnitModules units;  // ZeRO-3: the module of each unit
};

// The user's parameter groups (with their kernels and schedules); ZeRO inference has one group
// and no optimizer.
void resolve_optimizer_groups(EngineSetup& s, const InitializeOptions& options) {
  if (s.inference) {
    s.groups.resize(1);
    for (size_t i = 0; i < s.trainable.size(); ++i) s.groups[0].params.push_back(int64_t(i));
    return;
  }
  s.groups = actors::resolve_groups(s.trainable, options.param_groups, options.optimizer.get(), s.settings.optimizer);
  for (size_t g = 0; g < s.groups.size(); ++g) {
    s.groups[g].options.bf16_states = s.settings.bf16_optimizer_states;
    if (s.groups[g].client_step)
      s.group_kernels.push_back(std::make_shared<actors::ClientStepKernel>(options.optimizer, g, s.groups[g].options));
    else
      s.group_kernels.push_back(optim::make_optimizer_kernel(s.groups[g].options));  // validates (ConfigError naming the field)
    s.schedules.emplace_back(actors::group_schedule(s.settings, s.groups[g].options));
  }
}

// The sharding plan: every layout, once; at ZeRO-3 also the units and their modules.
void plan_layout(EngineSetup& s, torch::nn::Module& model) {
  std::vector<bool> lower(s.trainable.size(), false);
  if (s.settings.autocast) lower = actors::lower_precision_parameters(model, s.names, s.settings.lower_precision_safe_modules);
  std::vector<zero::PlannedParameter> planned(s.trainable.size());
  for (size_t g = 0; g < s.groups.size(); ++g)
    for (int64_t i : s.groups[g].params)
      planned[size_t(i)] = {s.names[size_t(i)], s.trainable[size_t(i)].second.sizes().vec(), int64_t(g), bool(lower[size_t(i)])};
  const bool stage3 = s.settings.stage == 3;
  if (stage3) actors::assign_stage3_units(model, s.trainable, actors::stage3_leaf_modules(model, s.resolved), planned);
  s.plan = sharding_plan(s.settings, s.size, planned);
  if (stage3) s.units = free_unit_modules(model, *s.plan);
}

// Step 1: everything that can be wrong is checked, and every layout planned, before the model
// changes (only a ZeRO-3 model's Sequential entries are swapped, undone if initialize fails).
EngineSetup prepare_engine(torch::nn::Module& model, const config::Config& config, const InitializeOptions& options) {
  EngineSetup s;
  s.world = options.world;
  if (s.world) {
    s.rank = s.world->rank(), s.size = s.world->size();
  } else {
    const auto env = transport::LaunchEnv::from_env();
    s.rank = env.rank, s.size = env.world_size;
  }
  auto facts = options.facts;
  facts.world_size = s.size;
  s.resolved = config::resolve_for_engine(config, facts);
  s.settings = actors::engine_settings(s.resolved);
  // ZeRO inference (DeepSpeed's, as Accelerate's prepare(model) gives it): no optimizer and no
  // client optimizer: stage 3 partitions every parameter and the engine only runs forwards.
  s.inference = !s.settings.optimizer && !options.optimizer && options.param_groups.empty();
  if (s.inference && s.settings.stage != 3)
    throw ConfigError("optimizer: the engine needs an `optimizer` section (type and params) or a client optimizer; "
                      "without one it is a ZeRO inference engine, which needs zero_optimization.stage = 3 (it is " +
                      std::to_string(s.settings.stage) + ")");
  if (s.inference && s.settings.has_scheduler)
    throw ConfigError("scheduler: a ZeRO inference engine (no optimizer) has no learning rate to schedule");
  s.trainable = trainable_parameters(model, s.inference);
  for (const auto& item : s.trainable) s.names.push_back(item.first);
  s.dtype = s.settings.precision == actors::Precision::bf16   ? at::kBFloat16
            : s.settings.precision == actors::Precision::fp16 ? at::kHalf
                                                              : at::kFloat;
  s.device = s.trainable.front().second.device();
  check_parameters(s.trainable, s.settings, s.dtype, s.rank, s.size);
  resolve_optimizer_groups(s, options);
  if (s.settings.precision == actors::Precision::fp16) s.scaler.emplace(s.settings.loss_scaler);
  plan_layout(s, model);
  return s;
}

// Step 3: the flat buffers (stages 0-2) or the unit storage (stage 3), the actors, the hooks.
std::unique_ptr<Engine::Impl> assemble_engine(EngineSetup& s, std::shared_ptr<torch::nn::Module> model,
                                              const InitializeOptions& options, const std::string& comm_name,
                                              std::shared_ptr<transport::Communicator> grad_comm,
                                              std::shared_ptr<transport::Communicator> param_comm) {
  const auto& plan = s.plan;
  const bool stage3 = s.settings.stage == 3, inference = s.inference;
  auto spec = engine_spec(s.settings, plan, s.dtype, s.device, s.rank, s.size, inference);
  if (!s.groups.empty() && s.groups.front().client_step) {
    if (spec->weight_home == zero::WeightHome::nvme)  // it steps whole partitions, in place, by their address
      throw ConfigError("zero_optimization.offload_param.device = \"nvme\" with a client optimizer run by its own step() "
                        "is not supported yet: use the config's optimizer section, or offload_param.device \"cpu\"");
    actors::detach_client_parameters(*options.optimizer);
  }
  std::vector<std::unique_ptr<zero::FlatParameters>> flat;
  std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels;  // per flat group
  std::vector<at::Tensor> partitions, parameters;
  for (const auto& [name, p] : s.trainable) parameters.push_back(p);
  std::unique_ptr<zero::Stage3Parameters> stage3_parameters;
  if (stage3) {
    stage3_parameters = stage3_storage(*plan, s.rank, s.size, parameters, s.dtype, param_comm, *spec);
    for (size_t g = 0; g < plan->groups().size(); ++g) {
      partitions.push_back(stage3_parameters->partition(int64_t(g)));
      if (!inference) kernels.push_back(s.group_kernels[size_t(plan->groups()[g].param_group)]);
    }
  } else {
    for (const auto& group : plan->groups()) {
      std::vector<std::pair<std::string, at::Tensor>> members;
      for (int64_t i : group.params) members.push_back(s.trainable[size_t(i)]);
      flat.push_back(std::make_unique<zero::FlatParameters>(members, group.layout, s.dtype));
      partitions.push_back(flat.back()->partition(plan->owned_partition(s.rank)));
      kernels.push_back(s.group_kernels[size_t(group.param_group)]);
    }
  }
  auto impl = std::make_unique<Engine::Impl>();
  impl->module = std::move(model);
  impl->config = s.resolved;
  impl->settings = s.settings;
  impl->spec = spec;
  impl->groups = s.groups;
  impl->schedules = std::move(s.schedules);
  impl->scaler = s.scaler;
  impl->names = s.names;
  impl->world = s.world;
  impl->comm_name = comm_name;
  // ZeRO-3 reduces every micro-step (into the partition, as stage 2 does), even on one rank.
  impl->micro = std::make_unique<actors::MicroSteps>(s.settings.gradient_accumulation_steps, plan->staged_gradients(),
                                                     s.size > 1 || stage3);
  if (spec->optimizer_offload.update == actors::UpdateTiming::during_backward)
    impl->micro->set_boundary_reductions(actors::BoundaryReductions::once);  // the update starts with the first
  if (plan->gradient_mode() == zero::GradientMode::reduce_to_owner)
    impl->staging = std::make_shared<actors::BucketStaging>(spec, parameters);
  impl->inference = inference;
  impl->sequential_units = std::move(s.units.sequential);
  if (stage3 && !inference) impl->unit_staging = std::make_shared<actors::UnitGradStaging>(spec, parameters);
  if (!inference)
    impl->reducer = actors::spawn_gradient_reducer(spec, parameters, flat, impl->staging, impl->unit_staging, grad_comm);
  if (plan->gradient_mode() == zero::GradientMode::all_reduce)
    for (const auto& p : parameters) impl->grad_views.emplace_back(p, p.grad().data_ptr());
  impl->parameter_shard = stage3 ? actors::spawn_stage3_parameter_shard(spec, std::move(stage3_parameters), param_comm)
                                 : actors::spawn_parameter_shard(spec, std::move(flat), param_comm);
  if (stage3) {
    impl->stage3 = std::make_shared<actors::Stage3Driver>(spec, impl->parameter_shard, impl->unit_staging, impl->bound());
    zero::register_units(impl->stage3, s.units.modules);
  }
  if (!inference)
    impl->optimizer_shard =
        actors::spawn_optimizer_shard(spec, std::move(kernels), partitions, impl->reducer, impl->parameter_shard);
  auto* raw = impl.get();
  if (!inference)
    impl->hooks = std::make_unique<zero::GradReadyHooks>(
        parameters, [raw](int64_t i) { raw->on_grad_ready(i); }, [raw] { raw->on_backward_end(); });
  for (const auto& hp : impl->hyperparameters()) impl->last_lrs.push_back(hp.lr);
  return impl;
}

}  // namespace

Initialized initialize(std::shared_ptr<torch::nn::Module> model, const config::Config& config,
                       const InitializeOptions& options) {
  if (!model) throw Error("initialize: the model is null");
  // 1. Checked and planned; 2. the data-parallel communicators; 3. buffers, actors, hooks.
  auto setup = prepare_engine(*model, config, options);
  const std::string comm_name = setup.size == 1 ? "" : setup.world ? setup.world->name() : actors::next_communicator_name("engine");
  auto [grad_comm, param_comm] = data_parallel_comms(setup.world, comm_name, setup.rank, setup.size, setup.settings,
                                                     setup.device.is_cuda(), setup.device.is_cuda() ? setup.device.index() : -1);
  auto impl = assemble_engine(setup, model, options, comm_name, grad_comm, param_comm);
  if (setup.rank == 0)
    for (const auto& warning : setup.resolved.warnings) log::warn("config: " + warning);
  if (!setup.resolved.tessera.checkpoint.sigterm_save_dir.empty()) install_sigterm_flag();
  Initialized out;
  out.engine = std::make_shared<Engine>(std::move(impl));
  out.optimizer = std::make_shared<EngineOptimizer>(out.engine);
  if (setup.settings.has_scheduler) out.lr_scheduler = std::make_shared<EngineScheduler>(out.engine);
  return out;
}

}  // namespace tessera
