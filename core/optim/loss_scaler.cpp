#include "core/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace tessera::optim {

std::string LossScaleUpdate::describe() const {
  std::ostringstream msg;
  if (!skipped) {
    msg << "loss scale " << scale;
  } else if (scale != previous_scale) {
    msg << "OVERFLOW: step skipped, loss scale " << previous_scale << " -> " << scale;
  } else {
    msg << "OVERFLOW: step skipped, loss scale stays " << scale << ", hysteresis left " << hysteresis;
  }
  return msg.str();
}

LossScaler::LossScaler(const LossScalerOptions& o)
    : options_(o), scale_(o.dynamic ? o.initial_scale : o.static_scale), hysteresis_left_(o.hysteresis) {
  auto bad = [](const std::string& key, double v, const std::string& expected) {
    std::ostringstream msg;
    msg << "fp16." << key << " = " << v << ": expected " << expected;
    throw ConfigError(msg.str());
  };
  if (!(std::isfinite(scale_) && scale_ > 0))
    bad(o.dynamic ? "initial_scale_power" : "loss_scale", scale_, "a finite positive scale");
  if (o.dynamic && o.scale_window <= 0) bad("loss_scale_window", double(o.scale_window), "a positive integer");
  if (o.dynamic && !(o.min_scale > 0)) bad("min_loss_scale", o.min_scale, "a positive value");
  // hysteresis <= 0 is DeepSpeed's too: the hysteresis left never reaches 1, so overflows skip
  // steps and never lower the scale.
}

LossScaleUpdate LossScaler::update(bool overflow) {
  LossScaleUpdate u;
  u.previous_scale = scale_;
  u.skipped = overflow;
  if (overflow) ++skipped_steps_;
  if (!options_.dynamic) {
    ++iteration_;
    u.scale = scale_;
    u.hysteresis = hysteresis_left_;
    return u;
  }
  if (overflow) {
    if (options_.hysteresis == 1 || hysteresis_left_ == 1) {
      if (scale_ == options_.min_scale && options_.raise_error_at_min_scale) {
        --skipped_steps_;  // state stays as it was: the error leaves the scaler unchanged
        std::ostringstream msg;
        msg << "fp16: gradient overflow at the minimum loss scale " << scale_
            << " (fp16.min_loss_scale); cannot lower it further (iteration " << iteration_ << ")";
        throw Error(msg.str());
      }
      scale_ = std::max(scale_ / 2.0, options_.min_scale);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iteration_ = iteration_;
  } else {
    if (options_.consecutive_hysteresis) hysteresis_left_ = options_.hysteresis;
    const int64_t stable_interval = (iteration_ - last_overflow_iteration_) - 1;
    if (stable_interval > 0 && stable_interval % options_.scale_window == 0) {
      if (!options_.consecutive_hysteresis) hysteresis_left_ = options_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iteration_;
  u.scale = scale_;
  u.hysteresis = hysteresis_left_;
  return u;
}

}  // namespace tessera::optim
