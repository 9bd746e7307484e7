// The fused Adam kernel, 16 floats at a time (AVX-512F; built with -mavx512f -mfma -ffp-contract=off).
#include <immintrin.h>

#include "core/optim/detail/fused_adam_element.h"

namespace tessera::optim::detail {
namespace {

// bf16 of 16 floats, nearest even, NaN as 0x7FC0 (bf16_nearest_even, 16 lanes).
__m256i to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(rounded);
}

}  // namespace

void adam_avx512(const AdamConstants& c, const FusedAdamRun& run) {
  const __m512 decay_scale = _mm512_set1_ps(c.decay_scale), l2_decay = _mm512_set1_ps(c.l2_decay);
  const __m512 beta1 = _mm512_set1_ps(c.beta1), one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 sqrt_bc2 = _mm512_set1_ps(c.sqrt_bias_correction2), eps = _mm512_set1_ps(c.eps);
  const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);
  const int64_t whole = run.elements / 16 * 16;
  for (int64_t i = 0; i < whole; i += 16) {
    __m512 p = _mm512_loadu_ps(run.param + i), g = _mm512_loadu_ps(run.grad + i);
    if (c.decoupled) p = _mm512_mul_ps(p, decay_scale);
    if (c.l2) g = _mm512_fmadd_ps(p, l2_decay, g);
    const __m512 m = _mm512_fmadd_ps(g, one_minus_beta1, _mm512_mul_ps(_mm512_loadu_ps(run.exp_avg + i), beta1));
    const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g, _mm512_mul_ps(_mm512_loadu_ps(run.exp_avg_sq + i), beta2));
    const __m512 d = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), sqrt_bc2), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), d));
    _mm512_storeu_ps(run.param + i, p);
    _mm512_storeu_ps(run.exp_avg + i, m);
    _mm512_storeu_ps(run.exp_avg_sq + i, v);
    if (run.param_bf16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(run.param_bf16 + i), to_bf16(p));
  }
  adam_elements(c, run, whole, run.elements);
}

}  // namespace tessera::optim::detail
