// The field lists of the configuration structs: each modelled key is named once here, and the
// decoder (Node -> Config), the encoder (Config -> Node) and the key checker all walk these lists.
// Adding a key to config.h means adding one line here; nothing else has to know its name.
//
// A visitor V provides:
//   v.field(key, T& value, bool applies = true)   one scalar/list key; `applies` false means the key
//                                                 is not valid in this context (another optimizer
//                                                 type's parameter, for example)
//   v.section(key, S& value)                      a sub-table, walked with visit(S&, V&)
//   v.specs(key, std::vector<LayerSpec>& value)   an array of tables
#pragma once

#include "core/config/config.h"

namespace tessera::config::detail {

template <class V> void visit(Fp16Config& c, V& v) {
  v.field("enabled", c.enabled);
  v.field("auto_cast", c.auto_cast);
  v.field("loss_scale", c.loss_scale);
  v.field("initial_scale_power", c.initial_scale_power);
  v.field("loss_scale_window", c.loss_scale_window);
  v.field("hysteresis", c.hysteresis);
  v.field("min_loss_scale", c.min_loss_scale);
}

template <class V> void visit(Bf16Config& c, V& v) {
  v.field("enabled", c.enabled);
  v.field("bf16_master_weights_and_grads", c.bf16_master_weights_and_grads);
  v.field("bf16_optimizer_states", c.bf16_optimizer_states);
}

template <class V> void visit(TorchAutocastConfig& c, V& v) {
  v.field("enabled", c.enabled);
  v.field("dtype", c.dtype);
  v.field("lower_precision_safe_modules", c.lower_precision_safe_modules);
}

template <class V> void visit(DataTypesConfig& c, V& v) { v.field("grad_accum_dtype", c.grad_accum_dtype); }

// optimizer.params
template <class V> void visit(OptimizerConfig& c, V& v) {
  const bool adam = c.type == OptimizerType::adam || c.type == OptimizerType::adamw;
  const bool sgd = c.type == OptimizerType::sgd, adagrad = c.type == OptimizerType::adagrad;
  const bool lion = c.type == OptimizerType::lion;
  v.field("lr", c.lr);
  v.field("betas", c.betas, adam || lion);
  v.field("eps", c.eps, adam || adagrad);
  v.field("weight_decay", c.weight_decay);
  v.field("torch_adam", c.torch_adam, adam);
  v.field("adam_w_mode", c.adam_w_mode, adam);
  v.field("bias_correction", c.bias_correction, adam);
  v.field("amsgrad", c.amsgrad, adam);
  v.field("momentum", c.momentum, sgd);
  v.field("dampening", c.dampening, sgd);
  v.field("nesterov", c.nesterov, sgd);
  v.field("lr_decay", c.lr_decay, adagrad);
  v.field("initial_accumulator_value", c.initial_accumulator_value, adagrad);
}

// scheduler.params
template <class V> void visit(SchedulerConfig& c, V& v) {
  const bool wlr = c.type == SchedulerType::warmup_lr, decay = c.type == SchedulerType::warmup_decay_lr;
  const bool cosine = c.type == SchedulerType::warmup_cosine_lr, cycle = c.type == SchedulerType::one_cycle;
  v.field("warmup_min_lr", c.warmup_min_lr, wlr || decay);
  v.field("warmup_max_lr", c.warmup_max_lr, wlr || decay);
  v.field("warmup_num_steps", c.warmup_num_steps, !cycle);
  v.field("total_num_steps", c.total_num_steps, decay || cosine);
  v.field("warmup_type", c.warmup_type, !cycle);
  v.field("last_batch_iteration", c.last_batch_iteration);
  v.field("warmup_min_ratio", c.warmup_min_ratio, cosine);
  v.field("cos_min_ratio", c.cos_min_ratio, cosine);
  v.field("cycle_min_lr", c.cycle_min_lr, cycle);
  v.field("cycle_max_lr", c.cycle_max_lr, cycle);
  v.field("decay_lr_rate", c.decay_lr_rate, cycle);
  v.field("cycle_first_step_size", c.cycle_first_step_size, cycle);
  v.field("cycle_second_step_size", c.cycle_second_step_size, cycle);
  v.field("cycle_first_stair_count", c.cycle_first_stair_count, cycle);
  v.field("cycle_second_stair_count", c.cycle_second_stair_count, cycle);
  v.field("decay_step_size", c.decay_step_size, cycle);
  v.field("cycle_momentum", c.cycle_momentum, cycle);
  v.field("cycle_min_mom", c.cycle_min_mom, cycle);
  v.field("cycle_max_mom", c.cycle_max_mom, cycle);
  v.field("decay_mom_rate", c.decay_mom_rate, cycle);
}

template <class V> void visit(OffloadOptimizerConfig& c, V& v) {
  v.field("device", c.device);
  v.field("nvme_path", c.nvme_path);
  v.field("pin_memory", c.pin_memory);
  v.field("buffer_count", c.buffer_count);
  v.field("ratio", c.ratio);
}

template <class V> void visit(OffloadParamConfig& c, V& v) {
  v.field("device", c.device);
  v.field("nvme_path", c.nvme_path);
  v.field("pin_memory", c.pin_memory);
  v.field("buffer_count", c.buffer_count);
  v.field("buffer_size", c.buffer_size);
  v.field("max_in_cpu", c.max_in_cpu);
}

template <class V> void visit(LeafModuleConfig& c, V& v) {
  v.field("classes", c.classes);
  v.field("names", c.names);
  v.field("name_suffixes", c.name_suffixes);
}

template <class V> void visit(ZeroConfig& c, V& v) {
  v.field("stage", c.stage);
  v.field("allgather_partitions", c.allgather_partitions);
  v.field("allgather_bucket_size", c.allgather_bucket_size);
  v.field("overlap_comm", c.overlap_comm);
  v.field("reduce_scatter", c.reduce_scatter);
  v.field("reduce_bucket_size", c.reduce_bucket_size);
  v.field("contiguous_gradients", c.contiguous_gradients);
  v.section("offload_optimizer", c.offload_optimizer);
  v.section("offload_param", c.offload_param);
  v.field("sub_group_size", c.sub_group_size);
  v.field("stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size);
  v.field("stage3_param_persistence_threshold", c.stage3_param_persistence_threshold);
  v.field("stage3_max_live_parameters", c.stage3_max_live_parameters);
  v.field("stage3_max_reuse_distance", c.stage3_max_reuse_distance);
  v.field("stage3_gather_16bit_weights_on_model_save", c.stage3_gather_16bit_weights_on_model_save);
  v.section("leaf_module", c.leaf_module);
  v.field("zero_quantized_weights", c.zero_quantized_weights);
  v.field("zero_quantized_nontrainable_weights", c.zero_quantized_nontrainable_weights);
  v.field("zero_quantized_gradients", c.zero_quantized_gradients);
  v.field("zero_hpz_partition_size", c.zero_hpz_partition_size);
  v.field("memory_efficient_linear", c.memory_efficient_linear);
}

template <class V> void visit(LayerSpec& c, V& v) {
  v.field("patterns", c.patterns);
  v.field("partition_type", c.partition_type);
  v.field("shape", c.shape);
  v.field("partition_dim", c.partition_dim);
  v.field("model_types", c.model_types);
}

template <class V> void visit(PartitionConfig& c, V& v) {
  v.field("use_default_specs", c.use_default_specs);
  v.specs("layer_specs", c.layer_specs);
}

template <class V> void visit(TensorParallelConfig& c, V& v) {
  v.field("autotp_size", c.autotp_size);
  v.field("preset_model", c.preset_model);
  v.section("partition_config", c.partition_config);
}

template <class V> void visit(CompileConfig& c, V& v) {
  v.field("deepcompile", c.deepcompile);
  v.field("passes", c.passes);
}

template <class V> void visit(CheckpointBlockConfig& c, V& v) { v.field("tag_validation", c.tag_validation); }

template <class V> void visit(TransportConfig& c, V& v) {
  v.field("backend", c.backend);
  v.field("connect_timeout_ms", c.connect_timeout_ms);
  v.field("collective_timeout_ms", c.collective_timeout_ms);
  v.field("ucx_transports", c.ucx_transports);
}

template <class V> void visit(RolloutConfig& c, V& v) {
  v.field("replica_policy", c.replica_policy);
  v.field("staging_budget_bytes", c.staging_budget_bytes);
  v.field("max_rounds_in_flight", c.max_rounds_in_flight);
  v.field("sync_timeout_ms", c.sync_timeout_ms);
}

template <class V> void visit(CheckpointConfig& c, V& v) {
  v.field("keep_last", c.keep_last);
  v.field("async_save", c.async_save);
  v.field("sigterm_save_dir", c.sigterm_save_dir);
}

template <class V> void visit(TesseraOffloadConfig& c, V& v) {
  v.field("optimizer_during_backward", c.optimizer_during_backward);
}

template <class V> void visit(AioConfig& c, V& v) {
  v.field("block_size", c.block_size);
  v.field("queue_depth", c.queue_depth);
  v.field("intra_op_parallelism", c.intra_op_parallelism);
  v.field("single_submit", c.single_submit);
  v.field("overlap_events", c.overlap_events);
}

template <class V> void visit(TesseraConfig& c, V& v) {
  v.section("transport", c.transport);
  v.section("rollout", c.rollout);
  v.section("checkpoint", c.checkpoint);
  v.section("offload", c.offload);
}

// The top level, except optimizer and scheduler, whose `type` decides their params (walked by
// the decoder and encoder themselves).
template <class V> void visit(Config& c, V& v) {
  v.field("train_batch_size", c.train_batch_size);
  v.field("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu);
  v.field("gradient_accumulation_steps", c.gradient_accumulation_steps);
  v.field("gradient_clipping", c.gradient_clipping);
  v.field("steps_per_print", c.steps_per_print);
  v.field("wall_clock_breakdown", c.wall_clock_breakdown);
  v.section("fp16", c.fp16);
  v.section("bf16", c.bf16);
  v.section("torch_autocast", c.torch_autocast);
  v.section("data_types", c.data_types);
  v.section("zero_optimization", c.zero_optimization);
  v.section("tensor_parallel", c.tensor_parallel);
  v.section("compile", c.compile);
  v.section("checkpoint", c.checkpoint);
  v.section("aio", c.aio);
  v.section("tessera", c.tessera);
}

}  // namespace tessera::config::detail
