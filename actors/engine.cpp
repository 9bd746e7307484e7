#include "actors/engine.h"

#include <caf/all.hpp>
#include <torch/nn/module.h>

#include <ATen/ATen.h>

#include <atomic>
#include <cstdlib>
#include <optional>

#include "actors/actor_runtime.h"
#include "actors/detail/engine_shared.h"
#include "actors/engine_settings.h"
#include "actors/gradient_reducer.h"
#include "actors/optimizer_shard.h"
#include "actors/parameter_shard.h"
#include "actors/protocol.h"
#include "core/config/validate.h"
#include "core/error.h"
#include "core/optim/lr_schedule.h"
#include "core/zero/grad_ready_hooks.h"
#include "transport/communicator.h"
#include "transport/store.h"

namespace tessera {

struct Engine::Impl {
  std::shared_ptr<torch::nn::Module> module;
  config::Config config;
  actors::EngineSettings settings;
  std::shared_ptr<actors::detail::EngineShared> shared;
  std::unique_ptr<zero::GradReadyHooks> hooks;
  std::optional<optim::LrSchedule> schedule;
  caf::actor reducer, parameter_shard, optimizer_shard;
  std::atomic<bool> reducing{false};
  int64_t micro = 0, global = 0, skipped = 0;
  int boundary_backwards = 0;  // backward() calls in the current boundary micro-step
  double last_grad_norm = -1;

  bool boundary() const { return (micro + 1) % settings.gradient_accumulation_steps == 0; }
  optim::StepHyperparameters hyperparameters(int64_t update_index) const {
    optim::StepHyperparameters hp{settings.optimizer.lr, settings.optimizer.beta1, settings.optimizer.beta2};
    const auto v = schedule->at(update_index - 1 + settings.schedule_offset);
    hp.lr = v.lr;
    if (v.beta1) hp.beta1 = *v.beta1;
    if (v.beta2) hp.beta2 = *v.beta2;
    return hp;
  }
  ~Impl() {
    hooks.reset();  // disarm before the actors go
    for (auto* a : {&reducer, &parameter_shard, &optimizer_shard})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::shared_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const config::Config& config,
                                   const InitializeOptions& options) {
  if (!model) throw Error("initialize: the model is null");
  // 1. Everything that can be wrong is checked before the model changes.
  auto world = options.world;
  int rank = 0, size = 1;
  if (world) {
    rank = world->rank(), size = world->size();
  } else if (const char* ws = std::getenv("WORLD_SIZE"); ws && std::atoi(ws) > 1) {
    size = std::atoi(ws);
    rank = std::getenv("RANK") ? std::atoi(std::getenv("RANK")) : 0;
  }
  auto facts = options.facts;
  facts.world_size = size;
  auto resolved = config::resolve_auto(config, facts);
  config::refuse_unsupported(resolved);
  auto settings = actors::engine_settings(resolved);
  auto optimizer = optim::make_flat_optimizer(settings.optimizer);
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  for (auto& item : model->named_parameters())
    if (item.value().requires_grad()) trainable.emplace_back(item.key(), item.value());
  if (trainable.empty()) throw Error("initialize: the model has no parameter that requires grad");
  for (const auto& [name, p] : trainable)
    if (p.scalar_type() != at::kFloat || !p.device().is_cpu())
      throw Error("initialize: parameter '" + name + "' is " + std::string(c10::toString(p.scalar_type())) + " on " +
                  p.device().str() + "; the engine trains fp32 CPU parameters (mixed precision is not supported yet)");

  // 2. The data-parallel group.
  if (!world && size > 1) {
    transport::CommunicatorOptions co;
    co.name = actors::next_communicator_name("engine");
    co.timeout = std::chrono::milliseconds(settings.collective_timeout_ms);
    world = transport::Communicator::gloo(actors::job_store(), rank, size, co);
  }

  // 3. Flat buffers, buckets, actors, hooks.
  auto impl = std::make_unique<Engine::Impl>();
  impl->module = model;
  impl->config = resolved;
  impl->settings = settings;
  impl->schedule.emplace(settings.schedule);
  auto shared = std::make_shared<actors::detail::EngineShared>();
  shared->stage = settings.stage;
  shared->rank = rank;
  shared->world = size;
  shared->dp = world;
  shared->timeout = std::chrono::milliseconds(settings.collective_timeout_ms);
  // DeepSpeed aligns partitions to 2 elements; stage 0 keeps one "partition" holding everything.
  shared->flat = std::make_unique<zero::FlatParameters>(trainable, settings.stage >= 1 ? size : 1,
                                                        settings.stage >= 1 ? 2 : 1);
  shared->plan = zero::make_bucket_plan(
      shared->flat->layout(),
      settings.stage == 2 ? zero::BucketShape::reduce_scatter : zero::BucketShape::all_reduce,
      std::max<int64_t>(1, settings.reduce_bucket_elements));
  impl->shared = shared;
  auto& system = actors::actor_system();
  impl->reducer = actors::spawn_gradient_reducer(system, shared);
  impl->parameter_shard = actors::spawn_parameter_shard(system, shared);
  impl->optimizer_shard =
      actors::spawn_optimizer_shard(system, shared, std::move(optimizer), impl->reducer, impl->parameter_shard);
  auto* raw = impl.get();
  caf::actor reducer = impl->reducer;
  impl->hooks = std::make_unique<zero::GradReadyHooks>(
      shared->flat->parameters(),
      [raw, reducer](int64_t i) {
        if (raw->reducing.load()) caf::anon_send(reducer, actors::ready_atom::value, i);
      },
      [raw, reducer] {
        if (raw->reducing.load()) caf::anon_send(reducer, actors::flush_atom::value);
      });
  return std::make_shared<Engine>(std::move(impl));
}

void Engine::backward(const at::Tensor& loss) {
  auto& s = *impl_;
  if (!loss.defined() || loss.numel() != 1)
    throw Error("backward: the loss must be a scalar tensor (got " +
                (loss.defined() ? std::to_string(loss.numel()) + " elements" : std::string("undefined")) + ")");
  if (!loss.requires_grad()) throw Error("backward: the loss does not require grad (was it computed under no_grad?)");
  const bool boundary = s.boundary();
  if (boundary && s.boundary_backwards > 0)
    throw Error("backward: called twice in the micro-step that ends gradient accumulation (micro-step " +
                std::to_string(s.micro) + "); reduce once per boundary: call step() in between");
  if (!s.shared->flat->gradients_attached())
    throw Error("backward: a parameter's .grad was replaced or reset outside the engine; use engine.zero_grad()");
  const bool reduce = boundary && s.shared->world > 1;
  s.reducing = reduce;
  if (reduce) caf::anon_send(s.reducer, actors::begin_atom::value);
  scale(loss).backward();
  s.reducing = false;
  if (boundary) ++s.boundary_backwards;
}

at::Tensor Engine::scale(const at::Tensor& loss) const {
  const auto gas = impl_->settings.gradient_accumulation_steps;
  return gas > 1 ? loss / double(gas) : loss;
}

void Engine::step() {
  auto& s = *impl_;
  if (!s.boundary()) {
    ++s.micro;
    return;
  }
  actors::StepRequest request;
  request.hyperparameters = s.hyperparameters(s.global);
  request.max_grad_norm = s.settings.max_grad_norm;
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
  ++s.global;
  ++s.micro;
  s.boundary_backwards = 0;
  s.shared->flat->zero_grad();
}

void Engine::zero_grad() { impl_->shared->flat->zero_grad(); }
bool Engine::is_gradient_accumulation_boundary() const { return impl_->boundary(); }
double Engine::get_lr() const { return impl_->hyperparameters(impl_->global).lr; }
int64_t Engine::global_steps() const { return impl_->global; }
int64_t Engine::micro_steps() const { return impl_->micro; }
int64_t Engine::skipped_steps() const { return impl_->skipped; }
double Engine::loss_scale() const { return 1.0; }
double Engine::last_grad_norm() const { return impl_->last_grad_norm; }
void Engine::train() { impl_->module->train(true); }
void Engine::eval() { impl_->module->eval(); }
std::shared_ptr<torch::nn::Module> Engine::module() const { return impl_->module; }
const config::Config& Engine::config() const { return impl_->config; }
int Engine::rank() const { return impl_->shared->rank; }
int Engine::world_size() const { return impl_->shared->world; }

}  // namespace tessera
