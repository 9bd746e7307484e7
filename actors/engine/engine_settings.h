// EngineSettings are the decisions the engine takes from a resolved Config: stage, accumulation,
// clipping, bucket size, optimizer and schedule options. One function makes them, and it is
// where a setting the engine cannot honour yet is refused (ConfigError naming the key) before
// the engine touches the model.
//
// Example: {"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.01}}} gives
// kind AdamW (DeepSpeed's Adam defaults to adam_w_mode = true), lr 1e-3, weight decay 0.01.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/update_timing.h"
#include "core/config/config.h"
#include "core/io/uring_file.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/optimizer_options.h"

namespace tessera::actors {

enum class Precision { fp32, bf16, fp16 };

// Derived from the Config by engine_settings(), which sets every field: a setting's default is the
// config's (core/config/config.h), written once there, so the numbers below are zero, not defaults.
struct EngineSettings {
  int64_t stage = 0;
  Precision precision = Precision::fp32;  // of the module's parameters and gradients
  bool fp32_master = false;               // bf16/fp16: fp32 master weights of the partition
  // bf16/fp16 with data_types.grad_accum_dtype = fp32: gradients accumulate across micro-steps in
  // an fp32 buffer, which is what gets reduced (in fp32) and stepped.
  bool fp32_grad_accumulation = false;
  optim::LossScalerOptions loss_scaler;   // fp16 only
  int64_t gradient_accumulation_steps = 1;
  double max_grad_norm = 0.0;                // 0 = no clipping
  int64_t reduce_bucket_elements = 0;         // zero_optimization.reduce_bucket_size
  int64_t sub_group_elements = 0;             // zero_optimization.sub_group_size: the optimizer's step unit
  bool overlap_comm = false;                  // zero_optimization.overlap_comm
  // ZeRO-3: parameters of at most this many elements stay gathered (stage3_param_persistence_threshold).
  int64_t persistence_threshold = 0;
  int64_t prefetch_elements = 0;   // stage3_prefetch_bucket_size
  int64_t max_live_elements = 0;   // stage3_max_live_parameters
  int64_t max_reuse_elements = 0;  // stage3_max_reuse_distance
  std::optional<optim::OptimizerOptions> optimizer;  // the `optimizer` section, if any
  bool bf16_optimizer_states = false;         // bf16.bf16_optimizer_states (any optimizer)
  optim::ScheduleOptions schedule;            // Constant when the config has no scheduler; its
                                              // base_lr and cycle_momentum are per group (below)
  bool has_scheduler = false;
  int64_t schedule_offset = 0;                // scheduler.params.last_batch_iteration + 1
  // torch_autocast: forward under CPU autocast in bf16; gradients of parameters owned by these
  // module types are reduced in bf16.
  bool autocast = false;
  std::vector<std::string> lower_precision_safe_modules;
  // zero_optimization.offload_optimizer: device cpu puts masters and states in host memory.
  config::OffloadDevice optimizer_offload = config::OffloadDevice::none;
  bool optimizer_offload_pin_memory = false;
  int64_t optimizer_offload_buffer_count = 0;
  double optimizer_offload_ratio = 0;  // offload_optimizer.ratio: of the sub-groups, the fraction on the host
  std::string optimizer_offload_nvme_path;  // device nvme: the swap files' directory (exists, writable)
  io::AioSettings aio;                      // the aio block (device nvme)
  // zero_optimization.offload_param (stage 3): device cpu keeps the weight partitions in host memory.
  config::OffloadDevice parameter_offload = config::OffloadDevice::none;
  bool parameter_offload_pin_memory = false;
  std::string parameter_offload_nvme_path;  // device nvme: the swap files' directory (exists, writable)
  int64_t parameter_offload_buffer_count = 0;  // device nvme: chunks of the swap in host memory
  int64_t parameter_offload_buffer_size = 0;   // device nvme: elements per chunk
  UpdateTiming optimizer_update = UpdateTiming::in_step;  // tessera.offload.optimizer_during_backward
  int64_t collective_timeout_ms = 0;  // tessera.transport.collective_timeout_ms
};

// `config` must be resolved (no "auto" left). Throws ConfigError for missing or unsupported
// settings (tensor parallelism, fp16 autocast on CPU, updating during backward beside NVMe) and an NVMe path that is
// not a writable directory.
EngineSettings engine_settings(const config::Config& config);

// The schedule of one parameter group: the config's scheduler over that group's lr (DeepSpeed
// cycles momentum only for optimizers with betas).
optim::ScheduleOptions group_schedule(const EngineSettings& settings, const optim::OptimizerOptions& group);

}  // namespace tessera::actors
