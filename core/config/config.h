// A Config is one typed training configuration: everything a DeepSpeed JSON file or a tessera
// TOML file says, as plain structs with DeepSpeed's defaults.
//
// Both syntaxes load into this one type (load.h) with the same key names, the same validation
// (validate.h) and the same defaults; a Config can be written back as either (write.h), and
// reading that back gives an equal Config. Values a file may leave as "auto" (Accelerate and HF
// Transformers' convention) are Auto<T> fields; resolve_auto (resolve_auto.h) fills them from
// facts known only at start-up (world size, hidden size, the user's batch size and lr).
//
// Ownership: a Config is a value; copying it copies a few kilobytes. It holds no handles.
// Equality (operator==) compares the settings and the pass-through keys, not the bookkeeping
// (provenance, warnings, the not-yet-supported list, the source file name).
//
// Example: the DeepSpeed file
//   {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
//    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
//                          "offload_param": {"device": "cpu"}}}
// loads as train_micro_batch_size_per_gpu = 4 (given), train_batch_size = 0 (not given: derived
// as 4 x 2 x world size by resolve_auto), zero.stage = 3, zero.reduce_bucket_size = auto (waits
// for the hidden size h, then h*h), zero.offload_param.device = cpu, zero.stage3_max_live_parameters
// = 1e9 (DeepSpeed's default), and every other value at its default.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/affine/replica_policy.h"  // affine::ReplicaPolicyKind: [tessera.rollout] replica_policy
#include "core/config/provenance.h"

namespace tessera::config {

// A value a file may set to the string "auto": resolved later from facts (resolve_auto.h).
// While is_auto, `value` holds the default and means nothing.
template <class T>
struct Auto {
  T value{};
  bool is_auto = false;

  Auto() = default;
  Auto(T v) : value(std::move(v)) {}  // NOLINT: implicit, so defaults read naturally
  static Auto automatic() { Auto a; a.is_auto = true; return a; }
  bool operator==(const Auto& o) const { return is_auto == o.is_auto && (is_auto || value == o.value); }
  bool operator!=(const Auto& o) const { return !(*this == o); }
};

enum class OffloadDevice { none, cpu, nvme };
enum class OptimizerType { adam, adamw, sgd, adagrad, lion };
enum class SchedulerType { warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle };
enum class PartitionType { row, column, skip };
enum class TransportBackend { automatic, ucx, gloo, nccl };
enum class TagValidation { ignore, warn, fail };

// Names as the files spell them ("cpu", "AdamW", "WarmupDecayLR", ...; a replica policy's:
// affine::name_of).
const char* name_of(OffloadDevice v);
const char* name_of(OptimizerType v);
const char* name_of(SchedulerType v);
const char* name_of(PartitionType v);
const char* name_of(TransportBackend v);
const char* name_of(TagValidation v);

// A floating-point dtype as configs spell it (DeepSpeed accepts "bf16", "bfloat16",
// "torch.bfloat16", "half", "float", ...): "fp32", "fp16" or "bf16"; "" for anything else.
std::string canonical_dtype(const std::string& spelling);

#define TESSERA_CONFIG_EQ(T)                                           \
  bool operator==(const T& o) const { return tie() == o.tie(); }       \
  bool operator!=(const T& o) const { return !(*this == o); }

// fp16: DeepSpeed's own fp16 mixed precision with dynamic (loss_scale 0) or static loss scaling.
struct Fp16Config {
  Auto<bool> enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;            // 0 = dynamic loss scaling
  std::int64_t initial_scale_power = 16;  // dynamic scaling starts at 2^16
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  double min_loss_scale = 1.0;
  auto tie() const { return std::tie(enabled, auto_cast, loss_scale, initial_scale_power, loss_scale_window,
                                     hysteresis, min_loss_scale); }
  TESSERA_CONFIG_EQ(Fp16Config)
};

// bf16 ("bfloat16" is DeepSpeed's alias): bf16 parameters with fp32 master weights by default.
struct Bf16Config {
  Auto<bool> enabled = false;
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
  auto tie() const { return std::tie(enabled, bf16_master_weights_and_grads, bf16_optimizer_states); }
  TESSERA_CONFIG_EQ(Bf16Config)
};

// data_types: the dtype gradients accumulate in across micro-steps. Empty: the model's dtype
// (DeepSpeed's default); "fp32" with bf16/fp16 keeps an fp32 gradient accumulator that is also
// what gets reduced (fp32, float32, float, fp16, float16, half, bf16, bfloat16 accepted).
struct DataTypesConfig {
  std::string grad_accum_dtype;
  auto tie() const { return std::tie(grad_accum_dtype); }
  TESSERA_CONFIG_EQ(DataTypesConfig)
};

// torch_autocast: torch.autocast around forward; lower_precision_safe_modules are also reduced
// and gathered in `dtype`.
struct TorchAutocastConfig {
  bool enabled = false;
  std::string dtype = "bfloat16";  // bfloat16 | float16 (torch.bfloat16, bf16, fp16, half accepted)
  std::vector<std::string> lower_precision_safe_modules = {"torch.nn.Linear", "torch.nn.Conv1d",
                                                           "torch.nn.Conv2d", "torch.nn.Conv3d"};
  auto tie() const { return std::tie(enabled, dtype, lower_precision_safe_modules); }
  TESSERA_CONFIG_EQ(TorchAutocastConfig)
};

// optimizer: type and params. Which params a type takes: Adam/AdamW: lr betas eps weight_decay
// torch_adam adam_w_mode bias_correction amsgrad; SGD: lr momentum dampening weight_decay nesterov;
// Adagrad: lr lr_decay weight_decay eps initial_accumulator_value; Lion: lr betas weight_decay.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  Auto<double> lr = 1e-3;
  Auto<std::array<double, 2>> betas = std::array<double, 2>{0.9, 0.999};
  Auto<double> eps = 1e-8;
  Auto<double> weight_decay = 0.0;  // DeepSpeed's FusedAdam default (torch.optim.AdamW's is 0.01)
  bool torch_adam = false;
  bool adam_w_mode = true;          // Adam type only: decoupled weight decay (AdamW) when true
  bool bias_correction = true;
  bool amsgrad = false;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double lr_decay = 0.0;
  double initial_accumulator_value = 0.0;
  auto tie() const { return std::tie(type, lr, betas, eps, weight_decay, torch_adam, adam_w_mode, bias_correction,
                                     amsgrad, momentum, dampening, nesterov, lr_decay, initial_accumulator_value); }
  TESSERA_CONFIG_EQ(OptimizerConfig)
};

// scheduler: DeepSpeed's LR schedules. Which params a type takes: WarmupLR: warmup_min_lr
// warmup_max_lr warmup_num_steps warmup_type last_batch_iteration; WarmupDecayLR: those and
// total_num_steps; WarmupCosineLR: total_num_steps warmup_min_ratio warmup_num_steps cos_min_ratio
// warmup_type last_batch_iteration; OneCycle: the cycle_* and decay_* params.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::warmup_lr;
  Auto<double> warmup_min_lr = 0.0;
  Auto<double> warmup_max_lr = 1e-3;
  Auto<std::int64_t> warmup_num_steps = 1000;
  Auto<std::int64_t> total_num_steps = 0;  // 0 = not given (required by WarmupDecayLR, WarmupCosineLR)
  std::string warmup_type = "log";         // log | linear
  std::int64_t last_batch_iteration = -1;
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;               // required by OneCycle
  double decay_lr_rate = 0.0;
  std::int64_t cycle_first_step_size = 2000;
  std::int64_t cycle_second_step_size = 0;  // 0 = same as cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;
  std::int64_t cycle_second_stair_count = 0;
  std::int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  auto tie() const {
    return std::tie(type, warmup_min_lr, warmup_max_lr, warmup_num_steps, total_num_steps, warmup_type,
                    last_batch_iteration, warmup_min_ratio, cos_min_ratio, cycle_min_lr, cycle_max_lr, decay_lr_rate,
                    cycle_first_step_size, cycle_second_step_size, cycle_first_stair_count, cycle_second_stair_count,
                    decay_step_size, cycle_momentum, cycle_min_mom, cycle_max_mom, decay_mom_rate);
  }
  TESSERA_CONFIG_EQ(SchedulerConfig)
};

// zero_optimization.offload_optimizer: where the fp32 master weights and optimizer states live.
struct OffloadOptimizerConfig {
  Auto<OffloadDevice> device = OffloadDevice::none;
  std::string nvme_path;       // required with device nvme
  bool pin_memory = false;
  std::int64_t buffer_count = 4;
  double ratio = 1.0;  // partial offload: the fraction of the sub-groups whose optimizer work is on the host
  auto tie() const { return std::tie(device, nvme_path, pin_memory, buffer_count, ratio); }
  TESSERA_CONFIG_EQ(OffloadOptimizerConfig)
};

// zero_optimization.offload_param: where the partitioned parameters live (ZeRO-3 only).
struct OffloadParamConfig {
  Auto<OffloadDevice> device = OffloadDevice::none;
  std::string nvme_path;
  bool pin_memory = false;
  std::int64_t buffer_count = 5;
  std::int64_t buffer_size = 100'000'000;   // elements per NVMe swap buffer
  std::int64_t max_in_cpu = 1'000'000'000;  // elements kept in CPU memory with nvme
  auto tie() const { return std::tie(device, nvme_path, pin_memory, buffer_count, buffer_size, max_in_cpu); }
  TESSERA_CONFIG_EQ(OffloadParamConfig)
};

// aio: how NVMe offload reads and writes its swap files (DeepSpeed's aio block; io_uring here).
struct AioConfig {
  std::int64_t block_size = 1'048'576;    // bytes per I/O request piece (a multiple of 4096)
  std::int64_t queue_depth = 8;           // pieces in flight per I/O thread
  std::int64_t intra_op_parallelism = 1;  // I/O threads (DeepSpeed's older name: thread_count)
  bool single_submit = false;             // submit pieces one by one instead of in batches
  bool overlap_events = true;             // refill the queue as pieces complete
  auto tie() const { return std::tie(block_size, queue_depth, intra_op_parallelism, single_submit, overlap_events); }
  TESSERA_CONFIG_EQ(AioConfig)
};

// zero_optimization.leaf_module: modules whose whole subtree ZeRO-3 gathers at once.
struct LeafModuleConfig {
  std::vector<std::string> classes;
  std::vector<std::string> names;
  std::vector<std::string> name_suffixes;
  auto tie() const { return std::tie(classes, names, name_suffixes); }
  TESSERA_CONFIG_EQ(LeafModuleConfig)
};

struct ZeroConfig {
  Auto<std::int64_t> stage = 0;
  bool allgather_partitions = true;
  std::int64_t allgather_bucket_size = 500'000'000;  // elements; unused: partitions are gathered whole
  bool overlap_comm = false;                         // default true with stage 3 (DeepSpeed's rule)
  bool reduce_scatter = true;
  Auto<std::int64_t> reduce_bucket_size = 500'000'000;  // elements; auto = h*h; 0 = one bucket per parameter
  bool contiguous_gradients = true;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  std::int64_t sub_group_size = 1'000'000'000;
  Auto<std::int64_t> stage3_prefetch_bucket_size = 50'000'000;         // auto = int(0.9*h*h)
  Auto<std::int64_t> stage3_param_persistence_threshold = 100'000;     // auto = 10*h
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;
  Auto<bool> stage3_gather_16bit_weights_on_model_save = false;
  LeafModuleConfig leaf_module;
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
  std::int64_t zero_hpz_partition_size = 1;
  bool memory_efficient_linear = true;
  auto tie() const {
    return std::tie(stage, allgather_partitions, allgather_bucket_size, overlap_comm, reduce_scatter,
                    reduce_bucket_size, contiguous_gradients, offload_optimizer, offload_param, sub_group_size,
                    stage3_prefetch_bucket_size, stage3_param_persistence_threshold, stage3_max_live_parameters,
                    stage3_max_reuse_distance, stage3_gather_16bit_weights_on_model_save, leaf_module,
                    zero_quantized_weights, zero_quantized_nontrainable_weights, zero_quantized_gradients,
                    zero_hpz_partition_size, memory_efficient_linear);
  }
  TESSERA_CONFIG_EQ(ZeroConfig)
};

// One size of a layer spec's `shape`: a plain size (-1 = the rest), or explicit unequal parts
// such as GQA's [q_size, kv_size, kv_size] in the shape [[4096, 1024, 1024], -1].
struct ShapeDim {
  std::int64_t size = -1;             // used when parts is empty
  std::vector<std::int64_t> parts;
  bool operator==(const ShapeDim& o) const { return size == o.size && parts == o.parts; }
  bool operator!=(const ShapeDim& o) const { return !(*this == o); }
};

// tensor_parallel.partition_config.layer_specs[i]: parameters whose name matches a pattern are
// split by rows or columns; `shape` first views a fused weight as sub-matrices.
struct LayerSpec {
  std::vector<std::string> patterns;   // regexes over dotted parameter names
  PartitionType partition_type = PartitionType::column;
  std::vector<ShapeDim> shape;         // empty = not a fused weight
  std::int64_t partition_dim = 0;
  std::vector<std::string> model_types;  // empty = every model type
  auto tie() const { return std::tie(patterns, partition_type, shape, partition_dim, model_types); }
  TESSERA_CONFIG_EQ(LayerSpec)
};

struct PartitionConfig {
  bool use_default_specs = true;
  std::vector<LayerSpec> layer_specs;
  auto tie() const { return std::tie(use_default_specs, layer_specs); }
  TESSERA_CONFIG_EQ(PartitionConfig)
};

// tensor_parallel: AutoTP training (ZeRO stages 0-2). autotp_size 0 or 1 = no tensor parallelism (0 is DeepSpeed's default).
struct TensorParallelConfig {
  std::int64_t autotp_size = 1;
  std::string preset_model;  // "" or llama | bloom | chatglm | mixtral | deepseek_v2 | qwen2 | phi3
  PartitionConfig partition_config;
  auto tie() const { return std::tie(autotp_size, preset_model, partition_config); }
  TESSERA_CONFIG_EQ(TensorParallelConfig)
};

// compile: DeepCompile and its passes (e.g. "autosp", which needs ZeRO stage 0).
struct CompileConfig {
  bool deepcompile = false;
  std::vector<std::string> passes;
  auto tie() const { return std::tie(deepcompile, passes); }
  TESSERA_CONFIG_EQ(CompileConfig)
};

// checkpoint: DeepSpeed's own block. tessera acts on tag_validation: what save_checkpoint does
// when the ranks pass different tags (every rank writes into one tag directory, so ignore and
// warn save under rank 0's tag, warn saying so; fail refuses before anything is written). Its
// other keys are switches of DeepSpeed's writer and loader (core/config/keys.cpp says which).
struct CheckpointBlockConfig {
  TagValidation tag_validation = TagValidation::warn;  // DeepSpeed's default
  auto tie() const { return std::tie(tag_validation); }
  TESSERA_CONFIG_EQ(CheckpointBlockConfig)
};

// tessera.transport: how ranks reach each other (DeepSpeed has no keys for this).
// The transport's option structs (CommunicatorOptions, StoreOptions, TcpStoreOptions,
// RemoteExecutorOptions) take their defaults from here, so each is written once.
struct TransportConfig {
  TransportBackend backend = TransportBackend::automatic;  // auto: UCX when usable, else Gloo
  std::int64_t connect_timeout_ms = 60'000;      // rendezvous and endpoint creation
  std::int64_t collective_timeout_ms = 300'000;  // one collective or store wait
  std::vector<std::string> ucx_transports;       // UCX_TLS, e.g. ["rc", "sm", "self"]; empty = UCX's choice
  auto tie() const { return std::tie(backend, connect_timeout_ms, collective_timeout_ms, ucx_transports); }
  TESSERA_CONFIG_EQ(TransportConfig)
};

// tessera.rollout: the weight sync from the training engine into rollout engines
// (actors/rollout/weight_sync.h). These are the sync's defaults, written only here:
// WeightSyncOptions takes its own from them, and weight_sync_options(config) sets the sync's
// replica policy, staging budget and timeout from a loaded file.
struct RolloutConfig {
  // Which holder of a replicated box sends it (default: affine::kDefaultReplicaPolicy).
  affine::ReplicaPolicyKind replica_policy = affine::kDefaultReplicaPolicy;
  std::int64_t staging_budget_bytes = std::int64_t{64} << 20;  // in flight per process per transfer round
  std::int64_t max_rounds_in_flight = 2;  // accepted and validated; the sync does not read it yet
  std::int64_t sync_timeout_ms = 120'000;  // each wait of a sync: the jobs meeting, every phase
  auto tie() const { return std::tie(replica_policy, staging_budget_bytes, max_rounds_in_flight, sync_timeout_ms); }
  TESSERA_CONFIG_EQ(RolloutConfig)
};

// tessera.checkpoint: Engine::save_checkpoint's housekeeping (DeepSpeed's own `checkpoint` block
// has no keys for it: CheckpointBlockConfig above).
struct CheckpointConfig {
  std::int64_t keep_last = 0;  // after a save, remove all but the newest N tags (0: keep every one)
  bool async_save = false;     // save_checkpoint snapshots and returns; a writer thread writes and commits
  // Non-empty: on SIGTERM (tessera-launch forwards it to every rank) every rank saves a checkpoint
  // here at the next step() that ends a batch, agreed across ranks, and the process exits 0.
  std::string sigterm_save_dir;
  auto tie() const { return std::tie(keep_last, async_save, sigterm_save_dir); }
  TESSERA_CONFIG_EQ(CheckpointConfig)
};

// tessera.offload: how optimizer offload schedules its work (DeepSpeed has no key for this).
struct TesseraOffloadConfig {
  // Optimizer offload (cpu or nvme) at stage 2 across ranks or stage 3: each sub-group is updated on
  // the host as soon as its reduced gradients are final, while backward still runs for earlier
  // layers; the new weights go back in step(). Needs no clipping and no fp16 (both need every
  // gradient first).
  bool optimizer_during_backward = false;
  auto tie() const { return std::tie(optimizer_during_backward); }
  TESSERA_CONFIG_EQ(TesseraOffloadConfig)
};

struct TesseraConfig {
  TransportConfig transport;
  RolloutConfig rollout;
  CheckpointConfig checkpoint;
  TesseraOffloadConfig offload;
  auto tie() const { return std::tie(transport, rollout, checkpoint, offload); }
  TESSERA_CONFIG_EQ(TesseraConfig)
};

// A key DeepSpeed accepts that asks for a feature tessera does not have yet.
struct UnsupportedKey {
  std::string path;   // "communication_data_type"
  std::string value;  // as JSON text: "\"fp16\""
  std::string why;    // what tessera lacks
  bool operator==(const UnsupportedKey& o) const { return path == o.path && value == o.value; }
};

struct Config {
  // Batch sizes: 0 = not given (derived by resolve_auto, which knows the data-parallel size).
  Auto<std::int64_t> train_batch_size = 0;
  Auto<std::int64_t> train_micro_batch_size_per_gpu = 0;
  Auto<std::int64_t> gradient_accumulation_steps = 0;
  Auto<double> gradient_clipping = 0.0;  // <= 0 = no clipping (DeepSpeed clips above 0)
  std::int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  Fp16Config fp16;
  Bf16Config bf16;
  TorchAutocastConfig torch_autocast;
  DataTypesConfig data_types;
  std::optional<OptimizerConfig> optimizer;  // absent: the caller brings its own optimizer
  std::optional<SchedulerConfig> scheduler;
  ZeroConfig zero_optimization;
  TensorParallelConfig tensor_parallel;
  CompileConfig compile;
  CheckpointBlockConfig checkpoint;
  AioConfig aio;
  TesseraConfig tessera;
  // Keys tessera does not act on (ignored or not yet supported), kept as JSON text by dotted
  // path so that writing the config back keeps them: {"flops_profiler": "{\"enabled\":true}"}.
  std::map<std::string, std::string> passthrough;

  // Bookkeeping, not compared by operator==.
  std::string source;                          // file name, or "<string>"
  Provenance provenance;                       // per dotted key path
  std::vector<std::string> warnings;           // one line each
  std::vector<UnsupportedKey> unsupported;     // refused by refuse_unsupported (validate.h)

  auto tie() const {
    return std::tie(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping,
                    steps_per_print, wall_clock_breakdown, fp16, bf16, torch_autocast, data_types, optimizer, scheduler,
                    zero_optimization, tensor_parallel, compile, checkpoint, aio, tessera, passthrough);
  }
  TESSERA_CONFIG_EQ(Config)
};

#undef TESSERA_CONFIG_EQ

}  // namespace tessera::config
