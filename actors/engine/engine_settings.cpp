#include "actors/engine/engine_settings.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace tessera::actors {
namespace {

[[noreturn]] void not_yet(const config::Config& c, const std::string& key, const std::string& what) {
  throw ConfigError((c.source.empty() ? std::string() : c.source + ": ") + key + ": " + what +
                    " is not supported by the engine yet");
}

// A swap files' directory (nvme_path): exists, is a directory, is writable; else named.
void check_swap_directory(const config::Config& c, const std::string& key, const std::string& path) {
  const auto where = (c.source.empty() ? std::string() : c.source + ": ") + key + " = \"" + path + "\": ";
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw ConfigError(where + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw ConfigError(where + "not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0) throw ConfigError(where + "not writable: " + std::strerror(errno));
}

}  // namespace

EngineSettings engine_settings(const config::Config& c) {
  EngineSettings s;
  s.stage = c.zero_optimization.stage.value;
  if (s.stage < 0 || s.stage > 3)
    throw ConfigError("zero_optimization.stage = " + std::to_string(s.stage) + ": expected 0, 1, 2 or 3");
  if (c.fp16.enabled.value && c.bf16.enabled.value)
    throw ConfigError("fp16.enabled and bf16.enabled: choose one mixed precision, not both");
  if (c.fp16.enabled.value) {
    s.precision = Precision::fp16;
    s.fp32_master = true;
    auto& ls = s.loss_scaler;
    ls.dynamic = c.fp16.loss_scale == 0.0;
    ls.static_scale = c.fp16.loss_scale;
    ls.initial_scale = std::ldexp(1.0, int(c.fp16.initial_scale_power));
    ls.scale_window = c.fp16.loss_scale_window;
    ls.hysteresis = c.fp16.hysteresis;
    ls.min_scale = c.fp16.min_loss_scale;
    if (c.fp16.auto_cast) not_yet(c, "fp16.auto_cast", "casting the inputs of forward to fp16");
  } else if (c.bf16.enabled.value) {
    s.precision = Precision::bf16;
    s.fp32_master = !c.bf16.bf16_master_weights_and_grads;
  }
  {
    const auto& a = c.data_types.grad_accum_dtype;
    const auto accum = config::canonical_dtype(a);
    const bool fp32 = accum == "fp32", half = accum == "fp16", bf16 = accum == "bf16";
    const auto where = (c.source.empty() ? std::string() : c.source + ": ") + "data_types.grad_accum_dtype = \"" + a + "\"";
    if ((half && s.precision != Precision::fp16) || (bf16 && s.precision != Precision::bf16))
      throw ConfigError(where + ": gradients accumulate in the model's dtype or in fp32; this model trains in " +
                        (s.precision == Precision::fp32 ? "fp32" : s.precision == Precision::bf16 ? "bf16" : "fp16"));
    s.fp32_grad_accumulation = fp32 && s.precision != Precision::fp32;
    if (s.fp32_grad_accumulation && !s.fp32_master)
      throw ConfigError(where + " needs fp32 master weights (bf16.bf16_master_weights_and_grads = false)");
  }
  if (c.torch_autocast.enabled) {
    const auto& d = c.torch_autocast.dtype;
    if (config::canonical_dtype(d) != "bf16")
      throw ConfigError((c.source.empty() ? std::string() : c.source + ": ") + "torch_autocast.dtype = \"" + d +
                        "\": LibTorch's CPU autocast runs only bfloat16 (and fp16 autocast needs a grad scaler)");
    s.autocast = true;
    s.lower_precision_safe_modules = c.torch_autocast.lower_precision_safe_modules;
  }
  {
    const auto& o = c.zero_optimization.offload_optimizer;
    if (o.device.value != config::OffloadDevice::none && s.stage == 0)
      throw ConfigError((c.source.empty() ? std::string() : c.source + ": ") +
                        "zero_optimization.offload_optimizer.device: optimizer offload needs ZeRO stage 1, 2 or 3");
    s.optimizer_offload = o.device.value;
    s.optimizer_offload_pin_memory = o.pin_memory;
    s.optimizer_offload_buffer_count = o.buffer_count;
    s.optimizer_offload_ratio = o.ratio;  // (with nvme below 1: refused by config validation's not-yet list)
    if (o.device.value == config::OffloadDevice::nvme) {
      s.optimizer_offload_nvme_path = o.nvme_path;
      check_swap_directory(c, "zero_optimization.offload_optimizer.nvme_path", o.nvme_path);
    }
  }
  if (c.tessera.offload.optimizer_during_backward) {
    // Refused where an update would need every gradient first, or where the early records could
    // not stay in memory until step() writes the weights back.
    const auto where = (c.source.empty() ? std::string() : c.source + ": ") + "tessera.offload.optimizer_during_backward: ";
    const auto device = c.zero_optimization.offload_optimizer.device.value;
    if (device == config::OffloadDevice::none)
      throw ConfigError(where + "needs zero_optimization.offload_optimizer.device = \"cpu\" (or \"nvme\")");
    if (s.stage < 2)
      throw ConfigError(where + "needs ZeRO stage 2 or 3 (partitioned gradients, final bucket by bucket); stage " +
                        std::to_string(s.stage) + " reduces every gradient at the end of backward");
    if (c.gradient_clipping.value > 0)
      throw ConfigError(where + "gradient_clipping = " + std::to_string(c.gradient_clipping.value) +
                        ": clipping scales every gradient by the global norm, known only when backward has ended");
    if (s.precision == Precision::fp16)
      throw ConfigError(where + "fp16: the overflow check needs every gradient before any update");
    s.optimizer_update = UpdateTiming::during_backward;
  }
  {
    const auto& o = c.zero_optimization.offload_param;
    if (o.device.value != config::OffloadDevice::none && s.stage != 3)
      throw ConfigError((c.source.empty() ? std::string() : c.source + ": ") +
                        "zero_optimization.offload_param.device: parameter offload needs ZeRO stage 3");
    s.parameter_offload = o.device.value;
    s.parameter_offload_pin_memory = o.pin_memory;
    if (o.device.value == config::OffloadDevice::nvme) {
      s.parameter_offload_nvme_path = o.nvme_path;
      s.parameter_offload_buffer_count = o.buffer_count;
      s.parameter_offload_buffer_size = o.buffer_size;
      check_swap_directory(c, "zero_optimization.offload_param.nvme_path", o.nvme_path);
      const auto where = (c.source.empty() ? std::string() : c.source + ": ") + "zero_optimization.offload_param.";
      if (o.buffer_count < 2)  // one chunk in use, one being written back or read ahead
        throw ConfigError(where + "buffer_count = " + std::to_string(o.buffer_count) +
                          ": parameters on NVMe need at least 2 buffers");
      if (o.buffer_size < 1)
        throw ConfigError(where + "buffer_size = " + std::to_string(o.buffer_size) + ": expected at least 1 element");
    }
  }
  if (c.tensor_parallel.autotp_size > 1) not_yet(c, "tensor_parallel.autotp_size", "tensor parallelism");
  s.aio.block_size = c.aio.block_size;
  s.aio.queue_depth = c.aio.queue_depth;
  s.aio.threads = c.aio.intra_op_parallelism;
  s.aio.single_submit = c.aio.single_submit;
  s.aio.overlap_events = c.aio.overlap_events;
  s.gradient_accumulation_steps = std::max<int64_t>(1, c.gradient_accumulation_steps.value);
  s.max_grad_norm = c.gradient_clipping.value;
  s.reduce_bucket_elements = c.zero_optimization.reduce_bucket_size.value;
  s.sub_group_elements = c.zero_optimization.sub_group_size;
  s.overlap_comm = c.zero_optimization.overlap_comm;
  s.persistence_threshold = c.zero_optimization.stage3_param_persistence_threshold.value;
  s.prefetch_elements = c.zero_optimization.stage3_prefetch_bucket_size.value;
  s.max_live_elements = c.zero_optimization.stage3_max_live_parameters;
  s.max_reuse_elements = c.zero_optimization.stage3_max_reuse_distance;  // (validated >= 0)
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"stage3_prefetch_bucket_size", s.prefetch_elements},
                               {"stage3_max_live_parameters", s.max_live_elements}})
    if (v < 0)
      throw ConfigError((c.source.empty() ? std::string() : c.source + ": ") + "zero_optimization." + key + " = " +
                        std::to_string(v) + ": expected a number of elements >= 0");
  if (s.persistence_threshold < 0)
    throw ConfigError((c.source.empty() ? std::string() : c.source + ": ") +
                      "zero_optimization.stage3_param_persistence_threshold = " + std::to_string(s.persistence_threshold) +
                      ": expected a number of elements >= 0");
  s.collective_timeout_ms = c.tessera.transport.collective_timeout_ms;

  s.bf16_optimizer_states = c.bf16.enabled.value && c.bf16.bf16_optimizer_states;
  if (c.optimizer) {
    const auto& o = *c.optimizer;
    optim::OptimizerOptions opt;
    switch (o.type) {
      case config::OptimizerType::adam:
        opt.kind = o.adam_w_mode ? optim::OptimizerKind::AdamW : optim::OptimizerKind::Adam;
        break;
      case config::OptimizerType::adamw: opt.kind = optim::OptimizerKind::AdamW; break;
      case config::OptimizerType::sgd: opt.kind = optim::OptimizerKind::SGD; break;
      case config::OptimizerType::adagrad: opt.kind = optim::OptimizerKind::Adagrad; break;
      case config::OptimizerType::lion: opt.kind = optim::OptimizerKind::Lion; break;
    }
    if (!o.bias_correction) not_yet(c, "optimizer.params.bias_correction", "Adam without bias correction");
    opt.lr = o.lr.value;
    opt.beta1 = o.betas.value[0];
    opt.beta2 = o.betas.value[1];
    opt.eps = o.eps.value;
    opt.weight_decay = o.weight_decay.value;
    opt.amsgrad = o.amsgrad;
    opt.momentum = o.momentum;
    opt.dampening = o.dampening;
    opt.nesterov = o.nesterov;
    opt.lr_decay = o.lr_decay;
    opt.initial_accumulator_value = o.initial_accumulator_value;
    opt.bf16_states = s.bf16_optimizer_states;
    s.optimizer = opt;
  }

  auto& sch = s.schedule;
  sch.base_lr = s.optimizer ? s.optimizer->lr : 1e-3;
  if (c.scheduler) {
    s.has_scheduler = true;
    const auto& p = *c.scheduler;
    switch (p.type) {
      case config::SchedulerType::warmup_lr: sch.kind = optim::ScheduleKind::WarmupLR; break;
      case config::SchedulerType::warmup_decay_lr: sch.kind = optim::ScheduleKind::WarmupDecayLR; break;
      case config::SchedulerType::warmup_cosine_lr: sch.kind = optim::ScheduleKind::WarmupCosineLR; break;
      case config::SchedulerType::one_cycle: sch.kind = optim::ScheduleKind::OneCycle; break;
    }
    sch.warmup_min_lr = p.warmup_min_lr.value;
    sch.warmup_max_lr = p.warmup_max_lr.value;
    sch.warmup_num_steps = p.warmup_num_steps.value;
    sch.warmup_type = p.warmup_type == "linear" ? optim::WarmupType::Linear : optim::WarmupType::Log;
    sch.total_num_steps = p.total_num_steps.value;
    sch.warmup_min_ratio = p.warmup_min_ratio;
    sch.cos_min_ratio = p.cos_min_ratio;
    sch.cycle_min_lr = p.cycle_min_lr;
    sch.cycle_max_lr = p.cycle_max_lr;
    sch.decay_lr_rate = p.decay_lr_rate;
    sch.cycle_first_step_size = p.cycle_first_step_size;
    if (p.cycle_second_step_size > 0) sch.cycle_second_step_size = p.cycle_second_step_size;
    sch.cycle_first_stair_count = p.cycle_first_stair_count;
    if (p.cycle_second_stair_count > 0) sch.cycle_second_stair_count = p.cycle_second_stair_count;
    sch.decay_step_size = p.decay_step_size;
    sch.cycle_momentum = p.cycle_momentum;
    sch.cycle_min_mom = p.cycle_min_mom;
    sch.cycle_max_mom = p.cycle_max_mom;
    sch.decay_mom_rate = p.decay_mom_rate;
    s.schedule_offset = p.last_batch_iteration + 1;
  }
  optim::LrSchedule validate_schedule(sch);  // throws ConfigError naming scheduler.params.<key>
  return s;
}

optim::ScheduleOptions group_schedule(const EngineSettings& settings, const optim::OptimizerOptions& group) {
  auto sch = settings.schedule;
  sch.base_lr = group.lr;
  // DeepSpeed disables momentum cycling for optimizers without betas.
  sch.cycle_momentum = sch.cycle_momentum && (group.kind == optim::OptimizerKind::Adam ||
                                              group.kind == optim::OptimizerKind::AdamW ||
                                              group.kind == optim::OptimizerKind::Lion);
  return sch;
}

}  // namespace tessera::actors
