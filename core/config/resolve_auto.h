// resolve_auto fills the "auto" values of a Config from facts that are known only when training
// starts, and derives the batch size that the file left out. It is the one place that knows how.
//
// Rules (DeepSpeed's, and Accelerate's for "auto"):
//   train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp, where
//   dp = world size / autotp_size. Any two determine the third; all three must agree (the error
//   shows the arithmetic). Left out (not "auto"): accumulation defaults to 1 when only one of the
//   other two is given; "auto" values come from facts (micro batch, accumulation steps) or are
//   derived from the other two, never defaulted.
//   zero_optimization.reduce_bucket_size                 = h*h          (h = hidden size)
//   zero_optimization.stage3_prefetch_bucket_size        = int(0.9*h*h)
//   zero_optimization.stage3_param_persistence_threshold = 10*h
//   optimizer lr / weight_decay / betas / eps, gradient_clipping, scheduler warmup_max_lr (= lr),
//   warmup_num_steps, total_num_steps, fp16/bf16 enabled (mixed precision), zero stage, offload
//   devices and stage3_gather_16bit_weights_on_model_save come from the facts of those names;
//   scheduler warmup_min_lr "auto" is 0 (Accelerate's rule).
//
// Example: Accelerate's zero_stage3_offload_config.json with facts world size 2, hidden size 1280
// (gpt2-large), micro batch 32, lr 5e-4, weight decay 0, clipping 1.0, warmup 0 and 1000 steps:
// train_batch_size = 32 x 1 x 2 = 64, reduce_bucket_size = 1638400,
// stage3_prefetch_bucket_size = 1474560, stage3_param_persistence_threshold = 12800,
// warmup_max_lr = 5e-4; without a hidden size, the error names zero_optimization.reduce_bucket_size
// and "the model's hidden size (--hidden-size)".
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.h"

namespace tessera::config {

struct Facts {
  std::optional<std::int64_t> world_size;
  std::optional<std::int64_t> hidden_size;
  std::optional<std::int64_t> micro_batch_size;  // the user's per-device batch size
  std::optional<std::int64_t> gradient_accumulation_steps;
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<std::array<double, 2>> betas;
  std::optional<double> eps;
  std::optional<double> gradient_clipping;
  std::optional<std::int64_t> warmup_steps;
  std::optional<std::int64_t> total_steps;
  std::optional<std::string> mixed_precision;  // "no" | "fp16" | "bf16"
  std::optional<std::int64_t> zero_stage;
  std::optional<OffloadDevice> offload_optimizer_device;
  std::optional<OffloadDevice> offload_param_device;
  std::optional<std::string> offload_optimizer_nvme_path;  // used when the file leaves nvme_path out
  std::optional<std::string> offload_param_nvme_path;
  std::optional<bool> save_16bit_model;
};

// Resolves every auto value and the batch sizes, then validates the result (validate.h). Throws
// ConfigError naming each key that cannot be resolved and the fact it needs, or the batch
// arithmetic that does not agree. The result has no auto value left but
// stage3_gather_16bit_weights_on_model_save, which the save call decides when no fact gives it
// (it stays auto, pending in the provenance, and is never an error).
Config resolve_auto(const Config& config, const Facts& facts);

// What an engine calls before it touches anything: resolve_auto, then refuse_unsupported
// (validate.h). The result is complete, valid, and asks for nothing tessera lacks.
Config resolve_for_engine(const Config& config, const Facts& facts);

// Resolves what the given facts allow and leaves the rest auto, marked in the provenance with the
// fact each waits for (for `tessera config check`). Throws only for contradictions (batch sizes
// that disagree).
Config resolve_known(const Config& config, const Facts& facts);

// The auto values still unresolved: (key path, the fact it waits for).
std::vector<std::pair<std::string, std::string>> pending_auto(const Config& config);

// The fact an auto value at `path` waits for, in words with its command-line flag, e.g.
// "the model's hidden size (--hidden-size)"; "" for a path that cannot be auto.
std::string fact_for(const std::string& path);

}  // namespace tessera::config
