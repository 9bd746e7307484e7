// The fused Adam kernel, 8 floats at a time (AVX2 + FMA; built with -mavx2 -mfma -ffp-contract=off).
#include <immintrin.h>

#include "core/optim/detail/fused_adam_element.h"

namespace tessera::optim::detail {
namespace {

// bf16 of 8 floats, nearest even, NaN as 0x7FC0 (bf16_nearest_even, 8 lanes).
__m128i to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  const __m256i packed = _mm256_packus_epi32(rounded, rounded);  // per 128-bit lane: a0..a3 a0..a3 | a4..a7 a4..a7
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));  // lanes 0 and 2
}

}  // namespace

void adam_avx2(const AdamConstants& c, const FusedAdamRun& run) {
  const __m256 decay_scale = _mm256_set1_ps(c.decay_scale), l2_decay = _mm256_set1_ps(c.l2_decay);
  const __m256 beta1 = _mm256_set1_ps(c.beta1), one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2), one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 sqrt_bc2 = _mm256_set1_ps(c.sqrt_bias_correction2), eps = _mm256_set1_ps(c.eps);
  const __m256 neg_step_size = _mm256_set1_ps(c.neg_step_size);
  const int64_t whole = run.elements / 8 * 8;
  for (int64_t i = 0; i < whole; i += 8) {
    __m256 p = _mm256_loadu_ps(run.param + i), g = _mm256_loadu_ps(run.grad + i);
    if (c.decoupled) p = _mm256_mul_ps(p, decay_scale);
    if (c.l2) g = _mm256_fmadd_ps(p, l2_decay, g);
    const __m256 m = _mm256_fmadd_ps(g, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(run.exp_avg + i), beta1));
    const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g, _mm256_mul_ps(_mm256_loadu_ps(run.exp_avg_sq + i), beta2));
    const __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), sqrt_bc2), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), d));
    _mm256_storeu_ps(run.param + i, p);
    _mm256_storeu_ps(run.exp_avg + i, m);
    _mm256_storeu_ps(run.exp_avg_sq + i, v);
    if (run.param_bf16) _mm_storeu_si128(reinterpret_cast<__m128i*>(run.param_bf16 + i), to_bf16(p));
  }
  adam_elements(c, run, whole, run.elements);
}

}  // namespace tessera::optim::detail
