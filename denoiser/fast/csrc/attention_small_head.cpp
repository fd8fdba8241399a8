// Scaled dot-product attention for small heads (d = 16 or 32) on fp32 or bf16 CPU tensors, forward only.
//
// Why: the U-Net's pixel attention has many short heads (the shipped model: 4 heads of 16 dims over
// 256 or 64 pixel tokens). torch's CPU flash kernel runs them through general GEMM calls whose inner
// dimension is just d, which leaves half its time in call overhead and packing; attention was ~18% of
// a sampling step. Here one task is one (image, head): K is transposed once into a (d, N) panel, then
// blocks of 8 queries go through the four stages in registers and L1 (scores = q·kᵀ · 1/√d as an
// 8 x 32 register tile per pass, softmax numerators exp(s - max) with the row sums, weights x V
// accumulated as 8 x d registers, divided by the sums at the end).
//
// bf16 inputs (what the projections give under bf16 autocast) are read into fp32 and the four stages run in
// fp32 as for fp32 inputs; the output is rounded to bf16 once at the end. torch's bf16 flash kernel took ~1.6x
// this kernel's time on a Zen 5 (bench/precision_mix.md).
//
// Same function as torch.nn.functional.scaled_dot_product_attention (no mask, no dropout, default
// scale), rounding differs (tests/model/test_attention.py: against float64 and torch's SDPA). NaN in a score
// row makes that query's output NaN, as in torch. The kernel is compiled only where the CPU has AVX-512
// (`small_head_attention_compiled()` says whether it was); for other head sizes or dtypes, and in
// builds without it, the op calls torch's SDPA.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace {

#if defined(__AVX512F__)

using denoiser::to_float;  // float, or bf16 bits

constexpr int kRows = 8;  // queries per block: 8 x 2 score vectors, or 8 x DV output vectors, in registers

// One (image, head): q, k, v rows of D = 16 * DV values of T (float, or bf16 bits as uint16_t), `*_stride`
// values apart (token to token); out rows `out_stride` apart. kt (D x NP), scores (kRows x NP) are fp32 scratch,
// NP = N rounded up to 16.
template <int DV, typename T>
void attend(const T* q, const T* k, const T* v, int64_t q_stride, int64_t k_stride, int64_t v_stride,
            T* out, int64_t out_stride, int64_t N, float scale, float* kt, float* scores) {
  constexpr int D = 16 * DV;
  const int64_t NV = (N + 15) / 16, NP = NV * 16;
  const __mmask16 tail = N % 16 == 0 ? __mmask16(0xFFFF) : __mmask16((1u << (N % 16)) - 1);
  // (1) K transposed into a (D, NP) panel, zero padded: a score vector is 16 keys of one query
  for (int d = 0; d < D; ++d) {
    float* row = kt + d * NP;
    for (int64_t j = 0; j < N; ++j) row[j] = to_float(k[j * k_stride + d]);
    std::fill(row + N, row + NP, 0.0f);
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i0 = 0; i0 < N; i0 += kRows) {
    const int rows = int(std::min<int64_t>(kRows, N - i0));
    const T* qr[kRows];
    for (int r = 0; r < kRows; ++r) qr[r] = q + (i0 + std::min(r, rows - 1)) * q_stride;  // a short block repeats its last query
    // (2) scores = q·kᵀ · scale, two key vectors (32 keys) per pass (the panel's zero padding makes a
    // last odd vector harmless: its scores are computed and never read)
    for (int64_t jv = 0; jv < NV; jv += 2) {
      const float* k0p = kt + jv * 16;
      const float* k1p = jv + 1 < NV ? k0p + 16 : k0p;
      __m512 acc0[kRows], acc1[kRows];
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
      for (int d = 0; d < D; ++d) {
        const __m512 k0 = _mm512_loadu_ps(k0p + d * NP);
        const __m512 k1 = _mm512_loadu_ps(k1p + d * NP);
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) {
          const __m512 qd = _mm512_set1_ps(to_float(qr[r][d]));
          acc0[r] = _mm512_fmadd_ps(qd, k0, acc0[r]);
          acc1[r] = _mm512_fmadd_ps(qd, k1, acc1[r]);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        _mm512_storeu_ps(scores + r * NP + jv * 16, _mm512_mul_ps(acc0[r], vscale));
        if (jv + 1 < NV) _mm512_storeu_ps(scores + r * NP + (jv + 1) * 16, _mm512_mul_ps(acc1[r], vscale));
      }
    }
    // (3) softmax numerators exp(s - max) in place, padded keys zeroed, and 1 / row sum
    float inv_sum[kRows];
    for (int r = 0; r < kRows; ++r) {
      float* s = scores + r * NP;
      __m512 mx = _mm512_set1_ps(-INFINITY);
      for (int64_t jv = 0; jv < NV; ++jv) {
        const __mmask16 m = jv == NV - 1 ? tail : __mmask16(0xFFFF);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_loadu_ps(s + jv * 16));
      }
      const __m512 row_max = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
      __m512 sum = _mm512_setzero_ps();
      for (int64_t jv = 0; jv < NV; ++jv) {
        const __mmask16 m = jv == NV - 1 ? tail : __mmask16(0xFFFF);
        const __m512 e = _mm512_maskz_mov_ps(m, denoiser::exp16(_mm512_sub_ps(_mm512_loadu_ps(s + jv * 16), row_max)));
        _mm512_storeu_ps(s + jv * 16, e);
        sum = _mm512_add_ps(sum, e);
      }
      inv_sum[r] = 1.0f / _mm512_reduce_add_ps(sum);
    }
    // (4) weights x V: 8 queries x D accumulated in registers, normalised at the end
    __m512 o[kRows][DV];
    for (int r = 0; r < kRows; ++r)
      for (int u = 0; u < DV; ++u) o[r][u] = _mm512_setzero_ps();
    for (int64_t j = 0; j < N; ++j) {
      __m512 vj[DV];
      for (int u = 0; u < DV; ++u) vj[u] = denoiser::load16(v + j * v_stride + u * 16);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const __m512 p = _mm512_set1_ps(scores[r * NP + j]);
        for (int u = 0; u < DV; ++u) o[r][u] = _mm512_fmadd_ps(p, vj[u], o[r][u]);
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int u = 0; u < DV; ++u)
        denoiser::store16(out + (i0 + r) * out_stride + u * 16, _mm512_mul_ps(o[r][u], _mm512_set1_ps(inv_sum[r])));
  }
}

#endif  // __AVX512F__

}  // namespace

namespace denoiser {

bool small_head_attention_compiled() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// Whether small_head_attention runs its own kernel for these inputs (fp32 or bf16 CPU, one dtype, d = 16 or 32,
// no autograd, AVX-512 build) rather than torch's SDPA.
bool small_head_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if defined(__AVX512F__)
  const auto plain = [](const at::Tensor& t) {
    return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) &&
           t.dim() == 4 && t.stride(3) == 1 &&
           !(at::GradMode::is_enabled() && t.requires_grad());
  };
  const int64_t d = q.size(-1);
  return plain(q) && plain(k) && plain(v) && k.scalar_type() == q.scalar_type() &&
         v.scalar_type() == q.scalar_type() && (d == 16 || d == 32) && k.sizes() == q.sizes() &&
         v.sizes() == q.sizes();
#else
  return false;
#endif
}

// q, k, v (B, h, N, d) -> (B, h, N, d), laid out as (B, N, h, d) memory (as torch's CPU flash kernel
// returns it), so that the heads concatenate without a copy.
at::Tensor small_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!small_head_attention_applies(q, k, v)) return at::scaled_dot_product_attention(q, k, v);
#if defined(__AVX512F__)
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), NP = (N + 15) / 16 * 16;
  at::Tensor out = at::empty({B, N, H, D}, q.options());  // (B, N, h, d)
  const float scale = float(1.0 / std::sqrt(double(D)));
  const auto run = [&](auto* typed) {  // typed: a null pointer of the element type (float, or uint16_t for bf16)
    using T = std::remove_pointer_t<decltype(typed)>;
    const T *qp = static_cast<const T*>(q.const_data_ptr()), *kp = static_cast<const T*>(k.const_data_ptr()),
            *vp = static_cast<const T*>(v.const_data_ptr());
    T* op = static_cast<T*>(out.mutable_data_ptr());
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> kt(D * NP), scores(kRows * NP);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / H, h = t % H;
        const T* qh = qp + b * q.stride(0) + h * q.stride(1);
        const T* kh = kp + b * k.stride(0) + h * k.stride(1);
        const T* vh = vp + b * v.stride(0) + h * v.stride(1);
        T* oh = op + (b * N * H + h) * D;
        if (D == 16)
          attend<1>(qh, kh, vh, q.stride(2), k.stride(2), v.stride(2), oh, H * D, N, scale, kt.data(), scores.data());
        else
          attend<2>(qh, kh, vh, q.stride(2), k.stride(2), v.stride(2), oh, H * D, N, scale, kt.data(), scores.data());
      }
    });
  };
  if (q.scalar_type() == at::kBFloat16)
    run(static_cast<uint16_t*>(nullptr));
  else
    run(static_cast<float*>(nullptr));
  return out.transpose(1, 2);  // (B, h, N, d)
#else
  return at::scaled_dot_product_attention(q, k, v);
#endif
}

}  // namespace denoiser

TORCH_LIBRARY_FRAGMENT(denoiser, m) {
  m.def("small_head_attention(Tensor q, Tensor k, Tensor v) -> Tensor");
  m.def("small_head_attention_compiled() -> bool", &denoiser::small_head_attention_compiled);
}

TORCH_LIBRARY_IMPL(denoiser, CPU, m) {
  m.impl("small_head_attention", &denoiser::small_head_attention);
}
