// The fused Adam kernel's shared pieces (core/optim/fused_adam.h): the float constants of one
// update and the per-element arithmetic every path uses for its scalar tail. Include only from
// files built with -ffp-contract=off (the arithmetic's bits depend on it).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/optim/fused_adam.h"

namespace tessera::optim::detail {

// The scalars ATen converts to float, computed as LibTorch computes them (double first).
struct AdamConstants {
  bool decoupled = false;  // p *= decay_scale first
  bool l2 = false;         // g = fma(p, l2_decay, g)
  float decay_scale = 1, l2_decay = 0;
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float sqrt_bias_correction2 = 1, eps = 0, neg_step_size = 0;

  explicit AdamConstants(const FusedAdamStep& s) {
    const double bc1 = 1 - std::pow(s.beta1, double(s.step)), bc2 = 1 - std::pow(s.beta2, double(s.step));
    decoupled = s.decay == AdamDecay::decoupled && s.weight_decay != 0;
    l2 = s.decay == AdamDecay::l2 && s.weight_decay != 0;
    decay_scale = float(1 - s.lr * s.weight_decay);
    l2_decay = float(s.weight_decay);
    beta1 = float(s.beta1), one_minus_beta1 = float(1 - s.beta1);
    beta2 = float(s.beta2), one_minus_beta2 = float(1 - s.beta2);
    sqrt_bias_correction2 = float(std::sqrt(bc2));
    eps = float(s.eps);
    neg_step_size = float(-(s.lr / bc1));
  }
};

inline uint16_t bf16_nearest_even(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return 0x7FC0;
  return uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Elements [begin, end) of `run`, one at a time.
inline void adam_elements(const AdamConstants& c, const FusedAdamRun& run, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float p = run.param[i], g = run.grad[i];
    if (c.decoupled) p = p * c.decay_scale;
    if (c.l2) g = std::fma(p, c.l2_decay, g);
    const float m = std::fma(g, c.one_minus_beta1, run.exp_avg[i] * c.beta1);
    const float v = std::fma(c.one_minus_beta2 * g, g, run.exp_avg_sq[i] * c.beta2);
    const float d = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
    p = p + (c.neg_step_size * m) / d;
    run.param[i] = p, run.exp_avg[i] = m, run.exp_avg_sq[i] = v;
    if (run.param_bf16) run.param_bf16[i] = bf16_nearest_even(p);
  }
}

// The vector paths (fused_adam_avx2.cpp, fused_adam_avx512.cpp): whole vectors from the start,
// the rest by adam_elements.
void adam_avx2(const AdamConstants& c, const FusedAdamRun& run);
void adam_avx512(const AdamConstants& c, const FusedAdamRun& run);

}  // namespace tessera::optim::detail
