// Engine::Impl: what one Engine owns (its actors, the sharding plan's spec, the micro-step state,
// ZeRO-3's driver), shared by the files that implement Engine (engine.cpp: initialize and the
// training calls; engine_state_access.cpp: gathered scopes, memory, statistics, storage maps).
// Private to actors/engine: users hold Engine (engine.h).
#pragma once

#include <caf/all.hpp>
#include <torch/nn/module.h>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/bucket_staging.h"
#include "actors/engine/checkpoint_writer.h"
#include "core/checkpoint/background_removal.h"
#include "actors/engine/engine.h"
#include "actors/engine/engine_settings.h"
#include "actors/engine/group_resolution.h"
#include "actors/engine/micro_steps.h"
#include "actors/engine/stage3_driver.h"
#include "actors/engine_spec.h"
#include "actors/protocol.h"
#include "actors/unit_grad_staging.h"
#include "core/error.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/zero/grad_ready_hooks.h"
#include "core/zero/sequential_units.h"
#include "core/zero/unit_hooks.h"

namespace tessera {

using actors::ResolvedGroup;

struct Engine::Impl {
  std::shared_ptr<torch::nn::Module> module;
  config::Config config;
  actors::EngineSettings settings;
  std::shared_ptr<const actors::EngineSpec> spec;
  std::vector<ResolvedGroup> groups;          // the user's parameter groups
  std::vector<optim::LrSchedule> schedules;   // per parameter group
  std::optional<optim::LossScaler> scaler;    // fp16
  std::vector<std::string> names;             // trainable parameters' dotted names, model order
  // Stages 0/1: each parameter's .grad must stay a view of the reducer's gradient buffer at this
  // address (a handle check on the user's thread; the buffer is the reducer's).
  std::vector<std::pair<at::Tensor, const void*>> grad_views;
  actors::gradient_reducer_actor reducer;
  actors::parameter_shard_actor parameter_shard;
  actors::optimizer_shard_actor optimizer_shard;
  std::shared_ptr<actors::BucketStaging> staging;  // partitioned gradients
  std::shared_ptr<actors::UnitGradStaging> unit_staging;  // ZeRO-3
  std::shared_ptr<actors::Stage3Driver> stage3;           // ZeRO-3: the units' listener
  std::unique_ptr<zero::SequentialUnits> sequential_units;  // ZeRO-3: swapped Sequential entries (put back last)
  bool inference = false;  // ZeRO inference: no optimizer, no reducer, no hooks; forwards only
  // Checkpoints' coordination (small exchanges on the user's thread), made at the first save or
  // load: a group of `world` when one was given, else Gloo on the job's store; named after the
  // engine's data-parallel communicators.
  std::shared_ptr<transport::Communicator> world;
  std::string comm_name;
  std::shared_ptr<transport::Communicator> control;
  transport::Communicator* control_comm();  // nullptr on one rank
  // Another communicator over the same ranks, named comm_name + suffix (collective; nullptr on one rank).
  std::shared_ptr<transport::Communicator> new_communicator(const std::string& suffix);
  std::unique_ptr<CheckpointWriter> writer;  // asynchronous saves (made at the first)
  // Before anything that changes stored state (weights, masters, optimizer states): waits until
  // the asynchronous save in flight has snapshotted them. Returns the wait in seconds.
  double wait_for_snapshot() const;
  // Rank 0: removes a replaced checkpoint tag or exported files off the user's and writer's threads
  // (freeing a large file's blocks takes a while); a save waits for it before clearing leftovers.
  std::shared_ptr<checkpoint::BackgroundRemoval> removal = std::make_shared<checkpoint::BackgroundRemoval>();
  void refuse_in_inference(const char* what) const {
    if (inference)
      throw Error(std::string(what) + ": this is a ZeRO inference engine (initialize without an optimizer): it runs "
                  "forwards only; give the config an `optimizer` section to train");
  }
  // offload_states: what each kind moved to host memory (all zero: nothing offloaded).
  OffloadedStates offloaded;
  bool any_offloaded = false;
  void require_resident(const char* what) const {
    if (any_offloaded)
      throw Error(std::string(what) + ": the engine's states are offloaded (offload_states); call reload_states() first");
  }
  // A failure found where nothing could raise it (a Scope's destructor), raised by the next call.
  std::exception_ptr pending;
  void rethrow_pending() {
    if (pending) std::rethrow_exception(std::exchange(pending, nullptr));
  }
  std::unique_ptr<zero::GradReadyHooks> hooks;
  std::unique_ptr<actors::MicroSteps> micro;
  std::vector<double> last_lrs;  // of the last update
  int64_t global = 0, skipped = 0;
  double last_grad_norm = -1;
  StepTiming timing;

  std::chrono::milliseconds bound() const {  // for requests whose collectives have their own timeouts
    return (spec ? 3 * spec->timeout : std::chrono::milliseconds(0)) + std::chrono::seconds(10);
  }
  // DeepSpeed steps the scheduler only after updates that were not skipped.
  int64_t last_batch_iteration() const { return global - skipped - 1 + settings.schedule_offset; }
  // The hyperparameters of the next update, per parameter group.
  std::vector<optim::StepHyperparameters> hyperparameters() const {
    std::vector<optim::StepHyperparameters> out;
    for (size_t g = 0; g < schedules.size(); ++g) {  // (none in ZeRO inference)
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
    for (const auto& [p, expected] : grad_views) {
      const auto& g = p.grad();
      if (!g.defined() || g.data_ptr() != expected || !g.is_contiguous()) return false;
    }
    return true;
  }
  // Whether gradients go to the reducer at all: across ranks, and at ZeRO-3 always (one rank's
  // gradients must still move from the units into the partition).
  bool reduces_gradients() const { return spec->world > 1 || stage3; }
  // A reduction starts: the reducer (and the staging) learn of it before any gradient arrives.
  // The gradient-ready routing, the engine's hottest path (autograd's thread, GradReadyHooks): the
  // first report of a backward may arm it; then, by the plan's gradient mode, the stage-3 driver,
  // the stage-2 staging or the reducer hears of parameter `param`.
  void on_grad_ready(int64_t param);
  // The end of a backward that fired a hook (autograd's thread): flush, fold or release.
  void on_backward_end();
  // `Trigger::armed`: a backward through backward()/scale(), the one kind whose boundary may start
  // the update during backward (tessera.offload.optimizer_during_backward).
  enum class Trigger : uint8_t { armed, hook, coalesced };
  void start_reduction(Trigger trigger) {
    const bool early = trigger == Trigger::armed && updates_during_backward() && micro->boundary();
    micro->start_reduction();
    if (!reduces_gradients()) return;
    if (staging) staging->start();
    if (unit_staging) unit_staging->start();
    caf::anon_send(reducer, actors::begin_atom::value);
    if (early) {  // after begin: the reducer's mailbox holds it before any next_final can arrive
      wait_for_snapshot();  // the update changes masters and states an asynchronous save may still copy
      actors::StepRequest request;
      request.hyperparameters = hyperparameters();
      caf::anon_send(optimizer_shard, actors::early_atom::value, std::move(request));
      update_started = true;
    }
  }
  bool updates_during_backward() const {
    return spec && spec->optimizer_offload.update == actors::UpdateTiming::during_backward;
  }
  // The boundary backward started the update; step() settles the reductions and finishes it.
  bool update_started = false;
  // Set when a step failed after its update had begun (during backward, or part-way through the
  // sub-groups, e.g. an NVMe record found changed): some masters and states moved on, others or
  // the weights did not; nothing can continue from that (it names the cause).
  std::string update_broken;
  void refuse_after_broken_update(const char* what) const {
    if (!update_broken.empty())
      throw Error(std::string(what) + ": " + update_broken + "; the optimizer state no longer matches the weights, so this "
                  "engine cannot go on: load a checkpoint into a new engine");
  }
  // What would read or replace the masters while the update during backward has moved them and
  // not the weights (write-backs, checkpoints, offload_states) waits for step().
  void refuse_during_update(const char* what) const {
    refuse_after_broken_update(what);
    if (update_started)
      throw Error(std::string(what) + ": the optimizer's update began during this boundary backward "
                  "(tessera.offload.optimizer_during_backward); call step() first");
  }
  // The end of a reducing backward: with partitioned gradients everything autograd did not report
  // (unused here, or accumulated in no_sync) is staged too; then every bucket is issued.
  void end_reduction() {
    if (staging) staging->take_rest();
    if (unit_staging) unit_staging->take_rest();
    caf::anon_send(reducer, actors::flush_atom::value);
  }
  ~Impl() {
    writer.reset();  // an asynchronous save in flight finishes first (it reads the engine's buffers)
    hooks.reset();  // disarm before the actors go
    if (stage3) zero::unregister_units(stage3.get());
    stop_actors();
  }
  // Ends the reducer, parameter-shard and optimizer-shard and waits until they have gone (their
  // states destroyed), at most bound(): see engine.cpp.
  void stop_actors();
};

}  // namespace tessera
