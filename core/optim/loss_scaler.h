// A LossScaler holds fp16 training's loss scale and moves it by DeepSpeed's dynamic rules:
// on overflow the step is skipped and, once the hysteresis is used up, the scale halves (never
// below min_scale); after `scale_window` steps without overflow it doubles.
//
// Every rank must feed it the same overflow flags (the engine all-reduces them first), so the
// scale is identical everywhere. Example with initial scale 2^16, window 2, hysteresis 2:
// overflow -> 65536 (hysteresis 2 -> 1), overflow -> 32768, ok, ok -> 65536 after the window.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::optim {

struct LossScalerOptions {
  bool dynamic = true;            // fp16.loss_scale == 0 means dynamic
  double static_scale = 1.0;      // fp16.loss_scale when > 0
  double initial_scale = 65536.;  // 2 ^ fp16.initial_scale_power (default 16)
  int64_t scale_window = 1000;    // fp16.loss_scale_window
  double min_scale = 1.0;         // fp16.min_loss_scale
  int64_t hysteresis = 2;         // fp16.hysteresis (<= 0: an overflow never lowers the scale)
  bool consecutive_hysteresis = false;  // fp16.consecutive_hysteresis
  bool raise_error_at_min_scale = true;
};

// What one update did, for the log line the engine prints on every skipped step.
struct LossScaleUpdate {
  bool skipped = false;       // the step was skipped (overflow)
  double previous_scale = 0;  // scale the step ran with
  double scale = 0;           // scale for the next step
  int64_t hysteresis = 0;     // remaining hysteresis after the update
  std::string describe() const;
};

// Everything update() depends on, for checkpoints: restore(state()) continues bit for bit.
struct LossScalerSnapshot {
  double scale = 1.0;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int64_t hysteresis_left = 0;
  int64_t skipped_steps = 0;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options);

  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t iteration() const { return iteration_; }

  // Records one optimizer step's overflow flag (already agreed across ranks). Throws
  // tessera::Error when an overflow happens at the minimum scale and raise_error_at_min_scale.
  LossScaleUpdate update(bool overflow);
  LossScalerSnapshot snapshot() const {
    return {scale_, iteration_, last_overflow_iteration_, hysteresis_left_, skipped_steps_};
  }
  void restore(const LossScalerSnapshot& s) {
    scale_ = s.scale, iteration_ = s.iteration, last_overflow_iteration_ = s.last_overflow_iteration;
    hysteresis_left_ = s.hysteresis_left, skipped_steps_ = s.skipped_steps;
  }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t iteration_ = 0;
  int64_t last_overflow_iteration_ = -1;
  int64_t hysteresis_left_;
  int64_t skipped_steps_ = 0;
};

}  // namespace tessera::optim
