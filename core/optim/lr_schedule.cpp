#include "core/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace tessera::optim {
namespace {

void require(bool ok, const std::string& key, double value, const std::string& expected) {
  if (ok) return;
  std::ostringstream msg;
  msg << "scheduler.params." << key << " = " << value << ": expected " << expected;
  throw ConfigError(msg.str());
}

}  // namespace

LrSchedule::LrSchedule(const ScheduleOptions& o) : options_(o) {
  const bool warmup = o.kind == ScheduleKind::WarmupLR || o.kind == ScheduleKind::WarmupDecayLR ||
                      o.kind == ScheduleKind::WarmupCosineLR;
  if (warmup) {
    require(o.warmup_num_steps > 0, "warmup_num_steps", double(o.warmup_num_steps), "a positive integer");
    warmup_steps_ = std::max<int64_t>(2, o.warmup_num_steps);
  }
  if (o.kind == ScheduleKind::WarmupDecayLR || o.kind == ScheduleKind::WarmupCosineLR)
    require(o.total_num_steps > 0, "total_num_steps", double(o.total_num_steps), "a positive integer");
  if (o.kind == ScheduleKind::OneCycle) {
    require(o.cycle_first_step_size > 0, "cycle_first_step_size", double(o.cycle_first_step_size), "> 0");
    require(!o.cycle_second_step_size || *o.cycle_second_step_size > 0, "cycle_second_step_size",
            double(o.cycle_second_step_size.value_or(0)), "> 0");
    require(o.cycle_first_stair_count >= 0, "cycle_first_stair_count", double(o.cycle_first_stair_count), ">= 0");
    require(o.decay_step_size >= 0, "decay_step_size", double(o.decay_step_size), ">= 0");
  }
}

double LrSchedule::warmup_gamma(int64_t it) const {
  if (options_.warmup_type == WarmupType::Log)
    return (1.0 / std::log(double(warmup_steps_))) * std::log(double(it + 1));
  return double(it) / double(warmup_steps_);
}

double LrSchedule::one_cycle_scale(int64_t last_batch_iteration) const {
  const auto& o = options_;
  const double first = double(o.cycle_first_step_size);
  const double second = double(o.cycle_second_step_size.value_or(o.cycle_first_step_size));
  const double total = first + second;
  const double step_ratio = first / total;
  const double batch_iteration = double(last_batch_iteration + 1);
  const double cycle = std::floor(1 + batch_iteration / total);
  const double x = 1. + batch_iteration / total - cycle;
  double scale;
  int64_t stair_count;
  if (x <= step_ratio) {
    scale = x / step_ratio;
    stair_count = o.cycle_first_stair_count;
  } else {
    scale = (x - 1) / (step_ratio - 1);
    stair_count = o.cycle_second_stair_count.value_or(o.cycle_first_stair_count);
  }
  if (stair_count > 0) {  // staircase: quantised from the integer position inside the cycle
    const double cycle_iteration = std::fmod(batch_iteration, total);
    const double position = cycle_iteration <= first ? cycle_iteration * double(stair_count) / first
                                                     : (total - cycle_iteration) * double(stair_count) / second;
    scale = std::floor(position) / double(stair_count);
  }
  return scale;
}

ScheduledValues LrSchedule::at(int64_t it) const {
  if (it < -1) throw Error("LrSchedule::at: iteration " + std::to_string(it) + " is below -1");
  const auto& o = options_;
  ScheduledValues v;
  switch (o.kind) {
    case ScheduleKind::Constant:
      v.lr = o.base_lr;
      return v;
    case ScheduleKind::WarmupLR:
    case ScheduleKind::WarmupDecayLR: {
      const double max_lr =
          o.warmup_max_lr.value_or(o.kind == ScheduleKind::WarmupLR ? o.base_lr : 0.001);
      const double min_lr = o.warmup_min_lr, delta = max_lr - min_lr;
      if (it < 0) {
        v.lr = min_lr;
        return v;
      }
      double gamma;
      if (it < warmup_steps_) {
        gamma = warmup_gamma(it);
      } else if (o.kind == ScheduleKind::WarmupLR) {
        gamma = 1.0;
      } else {
        gamma = std::max(0.0, double(o.total_num_steps - it) /
                                  double(std::max<double>(1.0, double(o.total_num_steps - warmup_steps_))));
      }
      v.lr = min_lr + delta * gamma;
      return v;
    }
    case ScheduleKind::WarmupCosineLR: {
      if (it < 0) return v;  // DeepSpeed sets lr 0 before the first scheduler step
      double ratio;
      if (it < warmup_steps_) {
        ratio = o.warmup_min_ratio + warmup_gamma(it) * (1. - o.warmup_min_ratio);
      } else {
        const double real_last_step = double(it - warmup_steps_ + 1);
        const double real_total_steps = double(std::max<int64_t>(1, o.total_num_steps - warmup_steps_));
        const double progress = std::min(1.0, real_last_step / real_total_steps);
        const double cosine = (1 + std::cos(M_PI * progress)) / 2;
        ratio = std::max(0.0, o.cos_min_ratio + (1. - o.cos_min_ratio) * cosine);
      }
      v.lr = o.base_lr * ratio;
      return v;
    }
    case ScheduleKind::OneCycle: {
      const double total = double(o.cycle_first_step_size) +
                           double(o.cycle_second_step_size.value_or(o.cycle_first_step_size));
      const bool skip_lr_decay = o.decay_step_size == 0 || o.decay_lr_rate == 0;
      const bool skip_mom_decay = o.decay_step_size == 0 || o.decay_mom_rate == 0;
      if (it < 0) {  // construction: lr = cycle_min_lr, betas = (cycle_min_mom, 0.99)
        v.lr = o.cycle_min_lr;
        if (o.cycle_momentum) v.beta1 = o.cycle_min_mom, v.beta2 = 0.99;
        return v;
      }
      if (double(it) < total) {
        const double scale = one_cycle_scale(it);
        v.lr = o.cycle_min_lr + (o.cycle_max_lr - o.cycle_min_lr) * scale;
        if (o.cycle_momentum) v.beta1 = o.cycle_max_mom - (o.cycle_max_mom - o.cycle_min_mom) * scale;
      } else {
        const double decay_iteration = double(it) - total + 1;
        v.lr = skip_lr_decay ? o.cycle_min_lr
                             : o.cycle_min_lr / (1 + o.decay_lr_rate * (decay_iteration / double(o.decay_step_size)));
        if (o.cycle_momentum)
          v.beta1 = skip_mom_decay ? o.cycle_max_mom
                                   : o.cycle_max_mom * (1 + o.decay_mom_rate * (decay_iteration / double(o.decay_step_size)));
      }
      if (o.cycle_momentum) v.beta2 = 0.99;
      return v;
    }
  }
  return v;
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "WarmupLR") return ScheduleKind::WarmupLR;
  if (name == "WarmupDecayLR") return ScheduleKind::WarmupDecayLR;
  if (name == "WarmupCosineLR") return ScheduleKind::WarmupCosineLR;
  if (name == "OneCycle") return ScheduleKind::OneCycle;
  throw ConfigError("scheduler.type = \"" + name +
                    "\": expected one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle");
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::Constant: return "Constant";
    case ScheduleKind::WarmupLR: return "WarmupLR";
    case ScheduleKind::WarmupDecayLR: return "WarmupDecayLR";
    case ScheduleKind::WarmupCosineLR: return "WarmupCosineLR";
    case ScheduleKind::OneCycle: return "OneCycle";
  }
  return "unknown";
}

}  // namespace tessera::optim
