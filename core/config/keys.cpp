#include "core/config/keys.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/config/node.h"

namespace tessera::config {
namespace {

constexpr KeyKind I = KeyKind::ignored;
constexpr KeyKind U = KeyKind::unsupported;
constexpr KeyKind A = KeyKind::alias;

// DeepSpeed's keys beyond the modelled ones, by section. Sources: the config-json documentation
// and DeepSpeed's runtime/config.py, runtime/zero/config.py, runtime/zero/offload_config.py,
// runtime/precision_config.py, module_inject/tp config, monitor/config.py.
const KeyRule kRules[] = {
    // top level: observability and tooling (no effect on results)
    {"", "zero_allow_untested_optimizer", I, "", "tessera runs only the optimizers it knows"},
    {"", "zero_force_ds_cpu_optimizer", I, "", "tessera chooses the CPU optimizer itself"},
    {"", "flops_profiler", I, "", "profiling"},
    {"", "activation_checkpointing", I, "", "applies only to models calling a checkpoint function (tessera::nn::checkpoint in C++)"},
    {"", "comms_logger", I, "", "logging"},
    {"", "comms_config", I, "", "communication logging and tuning"},
    {"", "monitor_config", I, "", "monitoring"},
    {"", "tensorboard", I, "", "monitoring"},
    {"", "wandb", I, "", "monitoring"},
    {"", "csv_monitor", I, "", "monitoring"},
    {"", "comet", I, "", "monitoring"},
    {"", "autotuning", I, "", "the autotuner is a DeepSpeed tool"},
    {"", "nebula", I, "", "checkpoint service"},
    {"", "timers", I, "", "timing"},
    {"", "memory_breakdown", I, "", "logging"},
    {"", "dump_state", I, "", "logging"},
    {"", "dataloader_drop_last", I, "", "tessera does not own the data loader"},
    {"", "pipeline", I, "", "applies only to PipelineModule models"},
    {"", "eigenvalue", I, "", "diagnostic"},
    {"", "disable_allgather", I, "", "deprecated"},
    {"", "seq_parallel_communication_data_type", I, "", "applies only with sequence parallelism"},
    {"", "use_data_before_expert_parallelism", I, "", "applies only with expert parallelism"},
    {"", "graph_harvesting", I, "", "CUDA-graph capture hint"},
    {"", "weight_quantization", I, "", "inference only"},
    {"", "bfloat16", A, "bf16", ""},
    // top level: features tessera lacks
    {"", "communication_data_type", U, "null", "reducing gradients in another dtype"},
    {"", "prescale_gradients", U, "false", "pre-scaling gradients before reduction"},
    {"", "gradient_predivide_factor", U, "1.0", "gradient pre-division"},
    {"", "sparse_gradients", U, "false", "sparse gradient reduction"},
    {"", "fp32_allreduce", U, "false", "fp32 gradient all-reduce of 16-bit gradients"},
    {"", "amp", U, "field:enabled", "NVIDIA Apex AMP"},
    {"", "sparse_attention", U, "", "sparse attention kernels"},
    {"", "data_efficiency", U, "field:enabled", "data sampling and routing"},
    {"", "curriculum_learning", U, "field:enabled", "curriculum learning"},
    {"", "elasticity", U, "field:enabled", "elastic batch sizes"},
    {"", "progressive_layer_drop", U, "field:enabled", "progressive layer dropping"},
    {"", "quantize_training", U, "field:enabled", "quantization-aware training"},
    {"", "compression_training", U, "", "compression-aware training"},
    {"", "hybrid_engine", U, "field:enabled", "the RLHF hybrid engine (tessera's rollout engines replace it)"},
    {"", "sequence_parallel_size", U, "1", "sequence parallelism"},
    {"", "zenflow", U, "", "ZenFlow asynchronous offload updates"},
    // fp16 / bf16
    {"fp16", "consecutive_hysteresis", U, "false", "consecutive hysteresis in loss scaling"},
    {"fp16", "fp16_master_weights_and_grads", U, "false", "fp16 master weights"},
    {"bf16", "immediate_grad_update", I, "", "an execution-order hint"},
    {"bf16", "check_grad_overflow", I, "", "bf16 has no overflow to check"},
    // checkpoint (DeepSpeed's writer and loader switches; tag_validation is modelled)
    {"checkpoint", "load_universal", I, "", "tessera's checkpoints load at any layout without conversion"},
    {"checkpoint", "checkpoint_serialization", I, "", "torch.save's zip format (tessera writes safetensors)"},
    {"checkpoint", "writer", I, "", "DeepSpeed's writer engines (tessera's asynchronous save: [tessera.checkpoint] async_save)"},
    {"checkpoint", "parallel_write", I, "", "applies only to pipeline stages"},
    {"checkpoint", "use_node_local_storage", U, "false", "checkpoints split across node-local disks"},
    // optimizer
    {"optimizer", "legacy_fusion", I, "", "a kernel choice"},
    {"optimizer.params", "fused", I, "", "a kernel choice"},
    {"optimizer.params", "foreach", I, "", "a kernel choice"},
    {"optimizer.params", "capturable", I, "", "a CUDA-graph hint"},
    {"optimizer.params", "set_grad_none", I, "", "gradient buffers are tessera's own"},
    {"optimizer.params", "maximize", U, "false", "maximizing the objective"},
    {"zero_optimization.offload_optimizer", "super_offload", U, "false", "SuperOffload"},
    {"zero_optimization.offload_optimizer", "cpuadam_cores_perc", I, "", "a CPU thread hint"},
    // zero_optimization
    {"zero_optimization", "round_robin_gradients", I, "", "a gradient-copy order hint"},
    {"zero_optimization", "load_from_fp32_weights", I, "", "checkpoint loading option"},
    {"zero_optimization", "elastic_checkpoint", I, "", "checkpoint format"},
    {"zero_optimization", "ignore_unused_parameters", I, "", "tessera tolerates unused parameters"},
    {"zero_optimization", "legacy_stage1", I, "", "deprecated"},
    {"zero_optimization", "use_multi_rank_bucket_allreduce", I, "", "a communication hint"},
    {"zero_optimization", "module_granularity_threshold", I, "", "a prefetch tuning hint"},
    {"zero_optimization", "stage3_module_granularity_threshold", I, "", "a prefetch tuning hint"},
    {"zero_optimization", "use_all_reduce_for_fetch_params", I, "", "a communication hint"},
    {"zero_optimization", "stage3_use_all_reduce_for_fetch_params", I, "", "a communication hint"},
    {"zero_optimization", "pipeline_loading_checkpoint", I, "", "checkpoint loading option"},
    {"zero_optimization", "override_module_apply", I, "", "a Python hook detail"},
    {"zero_optimization", "log_trace_cache_warnings", I, "", "logging"},
    {"zero_optimization", "mics_hierarchical_params_gather", I, "", "applies only with MiCS"},
    {"zero_optimization", "cpu_offload_use_pin_memory", I, "", "deprecated"},
    {"zero_optimization", "model_persistence_threshold", I, "", "a memory tuning hint"},
    {"zero_optimization", "stage3_gather_fp16_weights_on_model_save", A,
     "stage3_gather_16bit_weights_on_model_save", ""},
    {"aio", "thread_count", A, "intra_op_parallelism", ""},
    {"aio", "use_gds", U, "false", "GPUDirect Storage"},
    {"zero_optimization", "gather_16bit_weights_on_model_save", A, "stage3_gather_16bit_weights_on_model_save", ""},
    {"zero_optimization", "prefetch_bucket_size", A, "stage3_prefetch_bucket_size", ""},
    {"zero_optimization", "param_persistence_threshold", A, "stage3_param_persistence_threshold", ""},
    {"zero_optimization", "max_live_parameters", A, "stage3_max_live_parameters", ""},
    {"zero_optimization", "max_reuse_distance", A, "stage3_max_reuse_distance", ""},
    {"zero_optimization", "mics_shard_size", U, "-1", "MiCS sharding"},
    {"zero_optimization", "zeropp_loco_param", U, "null", "LoCo quantized-gradient compensation"},
    {"zero_optimization", "zenflow", U, "", "ZenFlow asynchronous offload updates"},
    {"zero_optimization", "cpu_offload", U, "false", "the deprecated cpu_offload switch (use offload_optimizer)"},
    {"zero_optimization", "cpu_offload_param", U, "false", "the deprecated cpu_offload_param switch (use offload_param)"},
    {"zero_optimization", "offload_optimizer_config", U, "", "the deprecated offload spelling"},
    {"zero_optimization.offload_optimizer", "pipeline_read", I, "", "an I/O overlap hint"},
    {"zero_optimization.offload_optimizer", "pipeline_write", I, "", "an I/O overlap hint"},
    {"zero_optimization.offload_optimizer", "pipeline", I, "", "deprecated I/O overlap hint"},
    {"zero_optimization.offload_optimizer", "fast_init", I, "", "an initialisation speed hint"},
    {"zero_optimization.offload_param", "pipeline_read", I, "", "an I/O overlap hint"},
    {"zero_optimization.offload_param", "pipeline_write", I, "", "an I/O overlap hint"},
    // tensor_parallel
    {"tensor_parallel", "tp_overlap_comm", I, "", "a communication overlap hint"},
    {"tensor_parallel", "tp_grain_size", I, "", "a partition granularity hint"},
    {"tensor_parallel", "keep_module_on_host", I, "", "an initialisation memory hint"},
    {"tensor_parallel", "dtype", I, "", "inference only"},
    {"tensor_parallel", "tp", U, "", "the legacy tp sub-section (use autotp_size)"},
    {"tensor_parallel", "injection_policy_tuple", U, "null", "injection policies"},
    // compile: DeepCompile's tuning switches
    {"compile", "offload_activation", I, "", "DeepCompile tuning"},
    {"compile", "offload_opt_states", I, "", "DeepCompile tuning"},
    {"compile", "double_buffer", I, "", "DeepCompile tuning"},
    {"compile", "symmetric_memory", I, "", "DeepCompile tuning"},
    {"compile", "free_activation", I, "", "DeepCompile tuning"},
    {"compile", "debug_log", I, "", "logging"},
    {"compile", "sync_before_reduce", I, "", "DeepCompile tuning"},
    {"compile", "sync_after_reduce", I, "", "DeepCompile tuning"},
    {"compile", "sync_before_allgather", I, "", "DeepCompile tuning"},
    {"compile", "sync_after_allgather", I, "", "DeepCompile tuning"},
    {"compile", "keep_int_input_tensors", I, "", "DeepCompile tuning"},
    {"compile", "keep_all_input_tensors", I, "", "DeepCompile tuning"},
};

const char* const kDeepSpeedOnlyOptimizers[] = {"onebitadam", "zerooneadam", "onebitlamb", "lamb", "muadam",
                                                "muadamw", "musgd", "muon", "adam8bit", "cpuadam", "fusedadam"};
const char* const kDeepSpeedOnlySchedulers[] = {"lrrangetest", "warmupcosinelr_legacy"};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

const KeyRule* find_key_rule(std::string_view section, std::string_view name) {
  for (const KeyRule& rule : kRules) {
    if (section == rule.section && name == rule.name) return &rule;
  }
  return nullptr;
}

std::vector<std::string> registry_keys(std::string_view section) {
  std::vector<std::string> out;
  for (const KeyRule& rule : kRules) {
    if (section == rule.section) out.emplace_back(rule.name);
  }
  return out;
}

bool is_inert(const KeyRule& rule, const Node& value) {
  const std::string_view inert = rule.detail;
  if (value.kind == Node::Kind::null) return true;
  if (inert.empty()) return false;
  if (inert.rfind("field:", 0) == 0) {
    // A table that asks for nothing unless this field is set (true, or a dtype other than fp32).
    if (!value.is_table()) return false;
    const Node* field = value.find(inert.substr(6));
    return field == nullptr || field->kind == Node::Kind::null ||
           (field->kind == Node::Kind::boolean && !field->boolean) ||
           (field->kind == Node::Kind::string && (field->string == "fp32" || field->string == "float32"));
  }
  if (inert == "null") return false;
  if (inert == "false" || inert == "true") {
    return value.kind == Node::Kind::boolean && value.boolean == (inert == "true");
  }
  const double want = std::stod(std::string(inert));
  if (value.kind == Node::Kind::integer) return static_cast<double>(value.integer) == want;
  if (value.kind == Node::Kind::floating) return value.floating == want;
  return false;
}

bool is_deepspeed_only_optimizer(std::string_view type) {
  const std::string t = lower(type);
  return std::any_of(std::begin(kDeepSpeedOnlyOptimizers), std::end(kDeepSpeedOnlyOptimizers),
                     [&](const char* n) { return t == n; });
}

bool is_deepspeed_only_scheduler(std::string_view type) {
  const std::string t = lower(type);
  return std::any_of(std::begin(kDeepSpeedOnlySchedulers), std::end(kDeepSpeedOnlySchedulers),
                     [&](const char* n) { return t == n; });
}

int edit_distance(std::string_view a, std::string_view b) {
  const std::string x = lower(a), y = lower(b);
  std::vector<int> row(y.size() + 1);
  for (std::size_t j = 0; j <= y.size(); ++j) row[j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= x.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (std::size_t j = 1; j <= y.size(); ++j) {
      const int above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (x[i - 1] == y[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[y.size()];
}

std::string closest_key(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_distance = 1 << 30;
  for (const std::string& c : candidates) {
    const int d = edit_distance(word, c);
    if (d < best_distance) best_distance = d, best = c;
  }
  const int limit = std::max<int>(2, static_cast<int>(word.size()) / 3);
  return best_distance <= limit ? best : std::string();
}

}  // namespace tessera::config
