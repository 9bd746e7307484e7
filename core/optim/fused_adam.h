// The fused CPU Adam / AdamW kernel (offload's optimizer step): one pass over a run of fp32
// parameters, gradients and both moments, 28 bytes per element (and a bf16 copy of the new
// parameters written in the same pass when asked), single-threaded, no LibTorch.
//
// Bitwise equal to LibTorch 1.13's torch::optim::Adam / AdamW (and so to OptimizerKernel's Adam):
// its step is six ATen ops, and on x86 with AVX2 or AVX-512 its vectorised CPU kernels round as
//   AdamW    p  = p * float(1 - lr wd)                        (only when wd != 0)
//   Adam L2  g  = fma(p, float(wd), g)                        grad.add(p, wd)
//            m  = fma(g, float(1 - b1), m * float(b1))        exp_avg.mul_(b1).add_(g, 1 - b1)
//            v  = fma(float(1 - b2) * g, g, v * float(b2))    exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
//            d  = sqrt(v) / float(sqrt(bc2)) + float(eps)     (v.sqrt() / sqrt(bc2)).add_(eps)
//            p  = p + (float(-lr / bc1) * m) / d              p.addcdiv_(m, d, -lr / bc1)
// with bc1 = 1 - b1^step, bc2 = 1 - b2^step in double (measured element by element against ATen,
// body and tails, at its AVX2 and AVX-512 capabilities; tests/optim/fused_adam_test.cpp). Each
// path below computes exactly that: explicit FMAs where ATen has them, no contraction elsewhere
// (these files build with -ffp-contract=off and -fno-math-errno), IEEE division and square root; so the scalar, AVX2
// and AVX-512 paths give the same bits, and the one a machine runs is chosen at run time.
// amsgrad is not here (the caller refuses it or runs OptimizerKernel).
#pragma once

#include <cstdint>

namespace tessera::optim {

enum class AdamDecay : uint8_t {
  l2,         // torch::optim::Adam: weight_decay * p added to the gradient
  decoupled,  // torch::optim::AdamW: p scaled by 1 - lr * weight_decay first
};

// One update's values, as the optimizer's options and schedule give them.
struct FusedAdamStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  AdamDecay decay = AdamDecay::l2;
  int64_t step = 1;  // this update's number, 1 for the first
};

// A run of `elements` elements; every pointer covers all of them. `param_bf16`, when set, receives
// the new parameters rounded to bf16 (nearest even, as at::Tensor::to(kBFloat16); NaN as 0x7FC0).
struct FusedAdamRun {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  uint16_t* param_bf16 = nullptr;
  int64_t elements = 0;
};

enum class SimdPath : uint8_t { scalar, avx2, avx512 };

const char* to_string(SimdPath path);
// Whether this CPU (and this build) can run `path`; scalar always can.
bool simd_path_available(SimdPath path);
// The widest available path: what fused_adam uses unless told otherwise.
SimdPath best_simd_path();

// One update of `run` in place. Throws tessera::Error, before touching anything, on a step < 1,
// a negative length, a missing buffer or an unavailable path.
void fused_adam(const FusedAdamRun& run, const FusedAdamStep& step);
void fused_adam(const FusedAdamRun& run, const FusedAdamStep& step, SimdPath path);

}  // namespace tessera::optim
