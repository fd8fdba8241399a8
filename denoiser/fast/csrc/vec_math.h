// Vector math shared by the kernels' AVX-512 paths.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace denoiser {

// exp on 16 fp32 lanes: Cephes' single-precision polynomial (about 1 ulp, the same as the scalar
// exp_approx in group_norm_nhwc.cpp), 2^n applied by scalef. Inputs are clamped to [-87.3, 88.7], so
// very negative lanes give ~1e-38 rather than 0; NaN lanes stay NaN (min/max return their second
// operand when either is NaN, and every later step keeps a NaN).
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  return _mm512_scalef_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f))), n);
}

}  // namespace denoiser

#endif
