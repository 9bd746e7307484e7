// The fused Adam kernel's checks and run-time dispatch (the arithmetic: detail/fused_adam_element.h).
#include "core/optim/fused_adam.h"

#include <string>

#include "core/error.h"
#include "core/optim/detail/fused_adam_element.h"

namespace tessera::optim {

const char* to_string(SimdPath path) {
  switch (path) {
    case SimdPath::scalar: return "scalar";
    case SimdPath::avx2: return "avx2";
    case SimdPath::avx512: return "avx512";
  }
  return "?";
}

bool simd_path_available(SimdPath path) {
  switch (path) {
    case SimdPath::scalar: return true;
#if defined(__x86_64__)
    case SimdPath::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdPath::avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
    default: return false;
#endif
  }
  return false;
}

SimdPath best_simd_path() {
  static const SimdPath best = simd_path_available(SimdPath::avx512) ? SimdPath::avx512
                               : simd_path_available(SimdPath::avx2) ? SimdPath::avx2
                                                                     : SimdPath::scalar;
  return best;
}

void fused_adam(const FusedAdamRun& run, const FusedAdamStep& step) { fused_adam(run, step, best_simd_path()); }

void fused_adam(const FusedAdamRun& run, const FusedAdamStep& step, SimdPath path) {
  if (step.step < 1) throw Error("fused Adam: update number " + std::to_string(step.step) + " < 1");
  if (run.elements < 0) throw Error("fused Adam: negative length " + std::to_string(run.elements));
  if (run.elements > 0 && (!run.param || !run.grad || !run.exp_avg || !run.exp_avg_sq))
    throw Error("fused Adam: a parameter, gradient or moment buffer is missing");
  if (!simd_path_available(path))
    throw Error(std::string("fused Adam: the ") + to_string(path) + " path is not available on this CPU");
  const detail::AdamConstants constants(step);
  switch (path) {
    case SimdPath::scalar: return detail::adam_elements(constants, run, 0, run.elements);
#if defined(__x86_64__)
    case SimdPath::avx2: return detail::adam_avx2(constants, run);
    case SimdPath::avx512: return detail::adam_avx512(constants, run);
#else
    default: return;  // not available (refused above)
#endif
  }
}

}  // namespace tessera::optim
