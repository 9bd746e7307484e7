// The Engine is what users hold: tessera's counterpart of DeepSpeed's training engine, driving a
// stock LibTorch module with ZeRO stages 0, 1, 2 and 3 (and, without an optimizer, ZeRO inference at
// stage 3) over a data-parallel group (docs/DESIGN.md §4, §5).
//
//   auto [engine, optimizer, lr_scheduler] = tessera::initialize(model, config);  // every rank
//   for (step...) { auto loss = engine->forward([&] { return ...model forward and loss...; });
//                   engine->backward(loss);               // (loss / accumulation steps).backward()
//                   engine->step(); }                     // updates at accumulation boundaries
//
// What happens: initialize() computes one sharding plan (core/zero/sharding_plan.h) and moves each
// parameter group's trainable parameters into one flat buffer (each parameter becomes a view, so
// the module's weights are always the engine's), owned by the parameter-shard actor; pinned
// AccumulateGrad hooks report each gradient as final, and the gradient-reducer actor, which owns
// the gradients, reduces buckets while backward goes on (all-reduce at stages 0/1, reduce to the
// partition's owner at stage 2). step() asks the optimizer-shard actor (masters and optimizer
// states) for one update: the reducer finishes and clips, the optimizer steps this rank's
// partition, the parameter-shard all-gathers it. Each communicator (gradients, parameters) has
// one issuing actor, in the plan's order (actors/protocol.h).
//
// Stages 0/1: gradients accumulate locally in the flat buffer over the micro-steps of one batch
// and are reduced once, in the backward of the boundary micro-step. Stage 2 (across ranks) keeps
// no full gradient buffer: every backward's gradients are copied into a fixed ring of staging
// buckets as they become ready, released, and reduced into this rank's gradient partition
// (DeepSpeed's order: average per micro-step, then sum); backward does not wait for them. A plain
// loss.backward() outside the engine (a joint loss over several engines) is recognised by the
// hooks and reduced the same way. In fp32 at 2 ranks the result equals a single-process LibTorch
// run that averages the ranks' gradients in the same order, bit for bit (tests/engine checks it).
//
// Precision: fp32; bf16 with fp32 master weights (or bf16 master with bf16.bf16_master_weights_
// and_grads, bf16 optimizer states with bf16_optimizer_states); fp16 with fp32 master and dynamic
// or static loss scaling, overflowing steps skipped on every rank, counted and logged. Gloo has
// no bf16/fp16 arithmetic: those gradients are reduced in fp32 and rounded once. Gradients
// accumulate across micro-steps in the model's dtype (DeepSpeed's default), or in an fp32
// buffer that is reduced in fp32 with data_types.grad_accum_dtype = "fp32".
// torch_autocast runs forward() under CPU autocast in bf16 (fp32 weights) and reduces the
// gradients of lower_precision_safe_modules in bf16 (actors/engine/autocast.h); at stage 3 it gathers
// their units in bf16 for forwards under autocast (the values autocast's cast gives anyway).
// Parameter groups (param_group.h) or a client torch::optim optimizer give per-group settings.
// ZeRO-3 (stage 3): every module that owns parameters is a unit (core/zero/unit_layout.h), held
// by a tessera::Unit holder (core/zero/unit_holder.h) or an entry of a stock torch::nn::Sequential
// (core/zero/sequential_units.h), gathered around its forward and for its backward, prefetched
// along the order recorded in the first update window, released at storage level; gradients are
// reduce-scattered unit by unit (actors/unit_grad_staging.h). Leaf modules (core/zero/
// leaf_modules.h) are gathered whole; a model built in a PartitionedConstruction scope (core/zero/
// partitioned_construction.h) is taken as its chunks. Between steps a parameter has no memory:
// read parameters inside gathered_parameters(). Without an optimizer, initialize at stage 3 builds a
// ZeRO inference engine (forwards only; each Engine::forward is a prefetch window).
// Not yet (each refused with a clear error at initialize): tensor parallelism, partial optimizer offload to NVMe.
// Cross-rank contract: every rank calls backward/step the same number of times, with the same
// accumulation boundaries, and at ZeRO-3 runs the same modules in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <exception>
#include <utility>
#include <vector>

#include "actors/engine/param_group.h"
#include "actors/offload_state.h"
#include "actors/engine/storage_maps.h"
#include "core/checkpoint/consolidate.h"
#include "core/checkpoint/hf_export.h"
#include "core/config/config.h"
#include "core/config/resolve_auto.h"
#include "core/optim/optimizer_options.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace tessera {

namespace transport {
class Communicator;
}

// Where the time of the last update went (seconds, measured by the optimizer shard).
struct StepTiming {
  double reduction_wait_s = 0;  // reductions not yet finished when step() began (not hidden by backward)
  double update_s = 0;          // unscale, overflow check, clip and optimizer update
  double gather_s = 0;          // all-gather of the updated partitions
  double offload_wait_s = 0;    // optimizer offload: waiting for device<->host copies not hidden by updates
  double offload_copy_s = 0;    // optimizer offload: the gradients' device->host copies, hidden or not
  // Waiting for an asynchronous save's snapshot of the buffers this update changes (what the
  // forward and backward since the save did not hide).
  double checkpoint_snapshot_wait_s = 0;
  // Optimizer offload to NVMe: the swap file's traffic this step, and what updates did not hide.
  struct Swap {
    int64_t bytes_read = 0, bytes_written = 0;
    int64_t prefetched = 0;     // sub-groups read ahead of their update (or still in memory)
    int64_t waited_reads = 0;   // sub-groups whose update waited for their read
    double read_wait_s = 0;     // reads not hidden by updates
    double write_wait_s = 0;    // writes a buffer had to wait for
  } swap;
  // tessera.offload.optimizer_during_backward: sub-groups whose gradients were final, and whose
  // update started, before step() (the rest were updated inside step()).
  int64_t updated_before_step = 0;
};

// What the engine holds per rank, in bytes (between steps; transient staging not included).
struct EngineMemory {
  int64_t parameters = 0;        // the flat parameter buffers (the module's weights)
  int64_t gradients = 0;         // flat gradient buffers, fp32 accumulators, reduced partitions and
                                 // any .grad not a view of them (partitioned gradients)
  int64_t master = 0;            // fp32 master partitions
  int64_t optimizer_states = 0;  // every state of every partition
  int64_t scratch = 0;           // reusable temporaries: the clipping norm's buffer, the optimizer's
                                 // workspace (from the first step on). Not counted: Gloo's own buffers.
  // Offload: what lives in host memory instead (with optimizer offload master and optimizer_states
  // above are 0, or with offload_optimizer.ratio < 1 the device's share; with parameter offload
  // parameters above counts only the gathered units).
  struct Host {
    int64_t parameters = 0;        // parameter offload: the weight partitions and persistent segments
    int64_t master = 0;            // master partitions (also for fp32 weights: the device's are a copy)
    int64_t optimizer_states = 0;
    int64_t staging = 0;           // gradient and weight slots between the device and the host, and
                                   // the kernels' workspace
    int64_t offloaded = 0;         // moved here by offload_states (and no longer counted above)
    int64_t swap_buffers = 0;      // offload to NVMe: the sub-group records' buffers (master and
                                   // optimizer_states above are 0 then, but while a checkpoint or
                                   // storage_maps() has paged the partitions in)
    int64_t total() const { return parameters + master + optimizer_states + staging + offloaded + swap_buffers; }
  } host;
  int64_t nvme = 0;  // offload to NVMe: the swap file (masters and optimizer states)
  int64_t total() const { return parameters + gradients + master + optimizer_states + scratch; }  // the device's
};

// offload_states: what to move, where (only host memory: "cpu"), and whether the host buffers are
// pinned (only where the buffers are on a GPU). Copies complete before the call returns whatever
// non_blocking says (accepted for DeepSpeed's signature).
struct OffloadStatesOptions {
  std::vector<OffloadState> include;  // empty: every kind
  config::OffloadDevice device = config::OffloadDevice::cpu;
  bool pin_memory = true;
  bool non_blocking = false;
};

// Bytes moved per kind by offload_states or reload_states.
struct OffloadedStates {
  int64_t parameters = 0, gradients = 0, master_weights = 0, optimizer_states = 0;
  int64_t total() const { return parameters + gradients + master_weights + optimizer_states; }
};

// ZeRO-3's gathers since initialize (zeros at stages 0-2).
// ZeRO-3 fetches of one kind: how many, and of them the ones already on their way (prefetched)
// or still gathered.
struct Stage3FetchCounts {
  int64_t fetches = 0;
  int64_t prefetched = 0;
  int64_t already_gathered = 0;
};

struct Stage3Stats {
  int64_t fetches = 0;           // units asked for by a forward, a backward or a gathered-parameters scope
  int64_t prefetched = 0;        // of them: already on their way, gathered ahead along the recorded order
  int64_t already_gathered = 0;  // of them: still gathered (nothing to do)
  int64_t prefetch_issued = 0;   // gathers issued ahead of demand
  int64_t divergences = 0;       // update windows that left the recorded module order
  int64_t kept_for_reuse = 0;    // releases skipped: used again within stage3_max_reuse_distance
  int64_t peak_gathered_bytes = 0;  // most unit storage gathered at once (persistent copies not included)
  int64_t gathered_wire_bytes = 0;  // of every gather: the gathered segments in their wire dtype (bf16
                                    // for lower-precision-safe modules under torch_autocast)
  double fetch_wait_s = 0;       // time the caller's thread waited for fetches
  // The counts above by why the unit was fetched.
  Stage3FetchCounts scope, forward_no_grad, forward, backward;
};

// The points of a save a test may stop at (kill -9 there must leave the last checkpoint intact).
enum class SavePoint : uint8_t {
  snapshot_begins,    // an asynchronous save, every rank: the writer, before it copies the buffers
  rank_file_written,  // every rank, its file synced in the partial directory
  manifest_written,   // rank 0, the manifest synced, before the directory's rename
  committed,          // rank 0, the tag renamed into place, before `latest`
  latest_written,     // rank 0, `latest` replaced
};

// Whether save_checkpoint returns once the checkpoint is committed or at once, the checkpoint
// writer snapshotting this rank's state while the next forward and backward run, then writing and
// committing while training goes on (whatever changes the state first waits for the snapshot).
enum class SaveMode : uint8_t {
  configured,    // [tessera.checkpoint] async_save decides
  synchronous,
  asynchronous,
};

// save_checkpoint's arguments (DeepSpeed's, by name).
struct CheckpointSaveOptions {
  std::string tag;                  // the tag directory's name; empty: "global_step<N>"
  std::string client_state = "{}";  // a JSON object saved with the checkpoint, returned by load
  bool save_latest = true;          // point DIR/latest at this tag
  SaveMode mode = SaveMode::configured;
  std::function<void(SavePoint)> at_point_for_testing;
};

// load_checkpoint's arguments (DeepSpeed's, by name).
struct CheckpointLoadOptions {
  std::string tag;                        // empty: the tag DIR/latest names
  bool load_optimizer_states = true;      // masters and optimizer states (else masters from the weights)
  bool load_lr_scheduler_states = true;   // the scheduler's position (else it keeps its own)
  bool load_module_only = false;          // the weights only: no optimizer state, no counters
};

struct CheckpointLoaded {
  std::string path;          // the tag directory read
  std::string tag;
  std::string client_state;  // the JSON object given to save_checkpoint
};

// save_16bit_model's arguments (DeepSpeed's exclude_frozen_parameters; the files are always
// Hugging Face's model.safetensors, sharded with an index above max_shard_bytes).
struct Save16BitOptions {
  int64_t max_shard_bytes = checkpoint::kDefaultMaxShardBytes;
  std::string config_json;                 // written as DIR/config.json when not empty
  bool exclude_frozen_parameters = false;  // frozen parameters are exported too, as DeepSpeed does
  checkpoint::ExportFill fill_for_testing = checkpoint::ExportFill::sparse;
};

struct ModelExported {
  std::vector<std::string> files;  // written into DIR (shards, then the index and config.json)
  int64_t bytes_written = 0;       // by this rank: its share of the tensors' bytes
};

struct InitializeOptions {
  // The data-parallel group. nullptr: from tessera-launch's environment (RANK, WORLD_SIZE,
  // MASTER_ADDR, MASTER_PORT) when WORLD_SIZE > 1, else a single-rank engine.
  std::shared_ptr<transport::Communicator> world;
  // Facts for "auto" values (the world size is filled in by initialize).
  config::Facts facts;
  // DeepSpeed's model_parameters as groups with their own settings; empty: one group of every
  // trainable parameter.
  std::vector<ParamGroup> param_groups;
  // A client optimizer built on the model's parameters, instead of the config's `optimizer`
  // section: its groups and options are used. torch::optim Adam, AdamW, SGD and Adagrad are
  // translated to tessera's flat optimizers; any other class is called by its own step() on the
  // partitions (group_resolution.h, client_optimizer.h). The engine's optimizer replaces it.
  std::shared_ptr<torch::optim::Optimizer> optimizer;
};

class Engine {
 public:
  // Ends a no_sync(), coalesce_grad_reduction() or gathered_parameters() block when it goes out
  // of scope, or at close(), which raises what ending it raised (a gathered-parameters write-back
  // that failed). A destructor cannot raise: the engine raises that error at its next call.
  class Scope {
   public:
    Scope(Scope&& other) noexcept : on_exit_(std::move(other.on_exit_)), keep_error_(std::move(other.keep_error_)) {
      other.on_exit_ = nullptr;
    }
    Scope& operator=(Scope&&) = delete;
    ~Scope() {
      try {
        if (on_exit_) on_exit_();
      } catch (...) {
        if (keep_error_) keep_error_(std::current_exception());
      }
    }
    void close() {
      auto exit = std::exchange(on_exit_, nullptr);
      if (exit) exit();
    }

   private:
    friend class Engine;
    explicit Scope(std::function<void()> on_exit, std::function<void(std::exception_ptr)> keep_error = nullptr)
        : on_exit_(std::move(on_exit)), keep_error_(std::move(keep_error)) {}
    std::function<void()> on_exit_;
    std::function<void(std::exception_ptr)> keep_error_;  // for the engine's next call
  };

  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs `fn` (the model's forward, and the loss if it is inside) under the engine's autocast:
  // CPU autocast in bf16 when torch_autocast is enabled; otherwise autocast is switched off
  // inside (the engine's own bf16/fp16 handle precision), as DeepSpeed's engine.forward does.
  // In a ZeRO inference engine each call is one prefetch window: the first call's module order
  // is recorded, later calls gather ahead along it (forwards outside forward() gather on demand).
  template <class F>
  decltype(auto) forward(F&& fn) {
    Scope scope = forward_scope();
    return std::forward<F>(fn)();
  }
  // forward()'s state (autocast, the inference window) until the Scope ends.
  [[nodiscard]] Scope forward_scope();
  // The autocast state of forward() until the Scope ends.
  [[nodiscard]] Scope autocast();

  // Backward of `loss` (a scalar) divided by gradient_accumulation_steps; at the accumulation
  // boundary, gradients are reduced while it runs.
  void backward(const at::Tensor& loss);
  // At an accumulation boundary: one optimizer update (waits for it) and a scheduler step, then
  // zeroes the gradients. Otherwise only counts the micro-step.
  void step();
  // Zeroes the accumulated gradients.
  void zero_grad();
  // The loss as backward() differentiates it (divided by the accumulation steps, times the fp16
  // loss scale), for a manual scale(loss).backward(); it also arms the reduction of that
  // backward. With fp16, a manual backward of an unscaled loss makes the next step() throw.
  at::Tensor scale(const at::Tensor& loss);

  // Inside the block, backward() accumulates gradients locally and reduces nothing, whatever the
  // accumulation boundary; the first backward at a boundary after it reduces everything
  // accumulated. step() inside raises. DeepSpeed forbids no_sync at ZeRO-2/3; tessera allows it
  // (stage 2 then keeps full local gradients in the parameters' .grad until the block ends).
  [[nodiscard]] Scope no_sync();
  // Several backward() (or scale(loss).backward()) calls whose gradients are reduced once, when
  // the block ends (stages 0/1: at an accumulation boundary; stage 2: at any micro-step, added
  // to the partition). step() inside raises; nesting it in no_sync or in
  // itself raises. DeepSpeed refuses stage 0 and its bf16/fp16 wrappers here; tessera allows them.
  [[nodiscard]] Scope coalesce_grad_reduction();

  // ZeRO-3: gathers the units of the named parameters (every unit with no names) on every rank
  // until the Scope ends (collective: every rank calls it with the same names, in the same order);
  // forwards inside release nothing the scope holds. Read a stage-3 model's parameters (a
  // snapshot, a state dict, a print) only inside one: a released parameter keeps its shape but
  // has no memory, and most LibTorch kernels crash on it instead of raising. With a
  // `modifier_rank` (DeepSpeed's GatheredParameters), that rank's changes to the gathered units
  // and to the persistent parameters are broadcast when the scope ends and written into every
  // rank's partitions (and fp32 masters); without one, changes are lost at the scope's end (the
  // persistent parameters named, or all with no names, are gathered again from the partitions).
  // Stages 0-2: nothing to do (every rank holds every parameter; keep them equal yourself).
  [[nodiscard]] Scope gathered_parameters(const std::vector<std::string>& names = {}, int modifier_rank = -1) const;
  // ZeRO-3: releases every gathered unit not held by a gathered-parameters scope (DeepSpeed's
  // empty_partition_cache), e.g. before a phase that needs the memory. Stages 0-2: nothing.
  void empty_partition_cache();
  // Calls f(name, weight) for every trainable parameter with its full value: at ZeRO-3 one unit
  // gathered at a time, in unit order, then the persistent parameters (collective: every rank
  // calls it); at stages 0-2 the module's parameters in model order. `weight` is the parameter
  // itself (detached); at ZeRO-3 it is released again after f returns.
  void for_each_gathered_parameter(const std::function<void(const std::string&, const at::Tensor&)>& f) const;
  // The trainable parameters' names in the groups for_each_gathered_parameter walks them in (ZeRO-3:
  // each unit's, then the persistent ones; stages 0-2: one group), for callers that gather one group
  // at a time themselves (gathered_parameters(group)), e.g. a Python generator.
  std::vector<std::vector<std::string>> gather_groups() const;

  bool is_gradient_accumulation_boundary() const;
  double get_lr(size_t group = 0) const;  // the lr the next update uses in a parameter group
  std::vector<double> get_lrs() const;    // of every parameter group
  size_t num_param_groups() const;
  std::vector<std::string> param_group_names(size_t group) const;  // its parameters' dotted names
  optim::OptimizerOptions param_group_options(size_t group) const;  // its optimizer settings
  // Sets a group's lr (every group's with nullopt) for the next updates; an Error when a
  // scheduler is configured (it sets the lr; tessera does not let the two fight).
  void set_lr(double lr, std::optional<size_t> group = std::nullopt);
  bool has_scheduler() const;
  // Scheduler steps taken (DeepSpeed's last_batch_iteration: -1 before the first update).
  int64_t last_batch_iteration() const;
  std::vector<double> last_lrs() const;   // the lrs of the last update (before any: the first's)
  int64_t global_steps() const;       // optimizer updates done
  int64_t micro_steps() const;        // step() calls
  int64_t skipped_steps() const;      // updates skipped (fp16 overflow)
  double loss_scale() const;          // 1 without fp16
  double last_grad_norm() const;      // of the last update with clipping, else -1
  StepTiming last_step_timing() const;
  EngineMemory memory() const;
  Stage3Stats stage3_stats() const;
  // Colocated RL (DeepSpeed's offload_states/reload_states, between training and generation):
  // moves what `include` names (every kind when empty) to host memory and frees the device's
  // copy, or brings it back, bit for bit. While offloaded the buffers have no memory: backward,
  // step, checkpoints, storage maps and ZeRO-3 gathers raise, and the module's weights (when
  // parameters are offloaded) must not be read, as a released ZeRO-3 parameter. With optimizer
  // offload (offload_optimizer.device cpu) masters and states are in host memory already: 0 bytes.
  // Local to the rank (no collective); call it between steps, outside gathered_parameters().
  OffloadedStates offload_states(const OffloadStatesOptions& options = {});
  OffloadedStates reload_states();  // what came back; nothing offloaded: zeros
  bool states_offloaded() const;
  // Affine maps of the weights, fp32 master and optimizer states over the data-parallel ranks,
  // with this rank's buffers (storage_maps.h). Call between steps. With the parameters on NVMe
  // the weight buffers are paged into host memory, lent until the next forward (or step).
  EngineStorage storage_maps() const;
  // The weights' maps and buffers alone (what a weight sync reads): no optimizer state asked for.
  EngineStorage weight_storage_maps() const;
  // Checkpoints (collective: every rank calls them with the same arguments; at a batch boundary,
  // between step() and the next backward). save writes DIR/<tag>/ (a file per rank and a
  // manifest) and commits it in one rename; returns the tag directory. load reads a checkpoint
  // saved at any data-parallel size and stage into this engine's layout, verifying every byte it
  // uses, and continues bit for bit where the save left off (engine_checkpoint.cpp,
  // core/checkpoint/). A bad checkpoint is a CheckpointError naming the file and tensor, raised
  // on every rank before any state changes.
  // An asynchronous save returns the tag directory it will commit; its failure is raised by
  // wait_for_checkpoint(), the next save or load, which wait for it (as the engine's destruction does).
  std::string save_checkpoint(const std::string& dir, const CheckpointSaveOptions& options = {});
  CheckpointLoaded load_checkpoint(const std::string& dir, const CheckpointLoadOptions& options = {});
  void wait_for_checkpoint();
  // The weights whole in their training dtype (bf16/fp16, or fp32 when training in fp32) as a
  // Hugging Face directory, collective: every rank writes the bytes it stores into the shared
  // files, no rank gathers the model (core/checkpoint/hf_export.h). Files are created under
  // temporary names and renamed once every rank's bytes are synced; shards of an earlier export
  // that the new one does not have are removed. Call between steps.
  ModelExported save_16bit_model(const std::string& dir, const Save16BitOptions& options = {});
  // Host memory the asynchronous saves snapshot into (0 before the first one).
  int64_t checkpoint_staging_bytes() const;
  void train();
  void eval();
  std::shared_ptr<torch::nn::Module> module() const;
  const config::Config& config() const;  // resolved
  int rank() const;
  int world_size() const;

  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);

 private:
  // [tessera.checkpoint] sigterm_save_dir: after an update, whether any rank got SIGTERM (agreed
  // on the control communicator); if so, save there and end the process with status 0.
  void save_and_exit_after_sigterm();
  std::unique_ptr<Impl> impl_;
};

// The optimizer initialize() returns, as DeepSpeed returns its ZeRO optimizer: the parameter
// groups and their settings; updates go through engine->step().
class EngineOptimizer {
 public:
  explicit EngineOptimizer(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  size_t num_param_groups() const { return engine_->num_param_groups(); }
  std::vector<std::string> param_group_names(size_t group) const { return engine_->param_group_names(group); }
  optim::OptimizerOptions param_group_options(size_t group) const { return engine_->param_group_options(group); }
  double get_lr(size_t group = 0) const { return engine_->get_lr(group); }
  void set_lr(double lr, std::optional<size_t> group = std::nullopt) { engine_->set_lr(lr, group); }
  void zero_grad() { engine_->zero_grad(); }

 private:
  std::shared_ptr<Engine> engine_;
};

// The learning-rate scheduler initialize() returns when the config has a `scheduler` section;
// the engine steps it after every update that was not skipped (as DeepSpeed does).
class EngineScheduler {
 public:
  explicit EngineScheduler(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  std::vector<double> get_lr() const { return engine_->get_lrs(); }  // for the next update
  std::vector<double> get_last_lr() const { return engine_->last_lrs(); }
  int64_t last_batch_iteration() const { return engine_->last_batch_iteration(); }

 private:
  std::shared_ptr<Engine> engine_;
};

struct Initialized {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<EngineOptimizer> optimizer;
  std::shared_ptr<EngineScheduler> lr_scheduler;  // nullptr without a scheduler section
};

// Builds an engine for `model` on every rank (collective over the data-parallel group). With no
// optimizer (no `optimizer` section, no client optimizer, no param_groups) at stage 3: a ZeRO
// inference engine over every parameter; backward(), step() and zero_grad() raise.
// Validates everything first: a bad or unsupported setting is a ConfigError naming the key and
// nothing about the model has changed.
Initialized initialize(std::shared_ptr<torch::nn::Module> model, const config::Config& config,
                       const InitializeOptions& options = {});

}  // namespace tessera
