// An LrSchedule is DeepSpeed's learning-rate schedule as a pure function of the step index:
// WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle (which also cycles Adam's beta1), with
// DeepSpeed's parameter names, defaults and quirks.
//
// Index convention (DeepSpeed's `last_batch_iteration`): the scheduler is stepped after every
// optimizer step, so optimizer step s (0-based) runs with lr_at(s - 1); lr_at(-1) is the value the
// scheduler sets when it is built. Example, WarmupLR{min 0, max 0.01, 100 steps, log}:
// lr_at(-1) = 0, lr_at(0) = 0, lr_at(9) = 0.01 * ln(10) / ln(100) = 0.005, lr_at(k >= 100) = 0.01.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::optim {

enum class ScheduleKind { Constant, WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle };
enum class WarmupType { Log, Linear };

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::Constant;
  double base_lr = 1e-3;  // the optimizer's lr (Constant, WarmupCosineLR; WarmupLR without max)
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;  // WarmupLR: the optimizer's lr when absent; WarmupDecayLR: 0.001
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::Log;
  int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR (required there)
  // WarmupCosineLR
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;  // = first when absent
  int64_t cycle_first_stair_count = 0;
  std::optional<int64_t> cycle_second_stair_count;  // = first stair count when absent
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

// What a schedule gives one optimizer step: the lr, and for OneCycle with cycle_momentum the
// betas (DeepSpeed sets (momentum, 0.99)).
struct ScheduledValues {
  double lr = 0.0;
  std::optional<double> beta1;
  std::optional<double> beta2;
};

class LrSchedule {
 public:
  // Validates (tessera::ConfigError naming `scheduler.params.<key>`).
  explicit LrSchedule(const ScheduleOptions& options);

  // Values after the scheduler has been stepped to `last_batch_iteration` (>= -1).
  ScheduledValues at(int64_t last_batch_iteration) const;
  double lr_at(int64_t last_batch_iteration) const { return at(last_batch_iteration).lr; }

  const ScheduleOptions& options() const { return options_; }

 private:
  double warmup_gamma(int64_t iteration) const;
  double one_cycle_scale(int64_t iteration) const;
  ScheduleOptions options_;
  int64_t warmup_steps_ = 2;  // DeepSpeed uses max(2, warmup_num_steps)
};

// "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle" (DeepSpeed's `scheduler.type`).
ScheduleKind parse_schedule_kind(const std::string& name);
std::string to_string(ScheduleKind kind);

}  // namespace tessera::optim
