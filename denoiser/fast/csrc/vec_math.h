// Vector math shared by the kernels' AVX-512 paths, and bfloat16 conversions (bf16 held as its uint16_t bits).
#pragma once

#include <cstdint>
#include <cstring>

namespace denoiser {

inline float bf16_to_float(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// the element types the kernels read, as fp32 (overloads: templates over float and bf16 bits call to_float)
inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) { return bf16_to_float(v); }

inline uint16_t float_to_bf16(float v) {  // round to nearest even, NaN stays NaN (torch's rounding)
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return (v != v) ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace denoiser

#if defined(__AVX512F__)
#include <immintrin.h>

namespace denoiser {

// 16 fp32 lanes from 16 floats or 16 bf16 values
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// 16 fp32 lanes stored as floats, or as bf16 rounded to nearest even as float_to_bf16 does
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(uint16_t* p, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

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
