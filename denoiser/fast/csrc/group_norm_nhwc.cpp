// GroupNorm (+ optional SiLU) for channels-last CPU tensors, forward and backward.
//
// Why: torch's CPU GroupNorm is fast for NCHW tensors but 3-12x slower for channels-last ones
// (bf16 especially), while the convolutions around it are fastest channels-last. This kernel reads
// the NHWC memory in order: every inner loop runs over the C contiguous channels of one pixel, so it
// vectorises, and SiLU is applied in the same pass (its backward is recomputed from x, so the
// normalised activation is never stored).
//
// Numerics follow torch's kernel: statistics and arithmetic in fp32 (double for the per-chunk
// combination), y = x * (rstd * w) + (b - mean * rstd * w), one rounding to the output dtype.
// Statistics: per 64-pixel chunk a mean and the squared deviations from it (fp32, the chunk read
// twice from L1), combined across chunks and channels in double with the parallel-variance formula,
// so neither a large mean nor an outlier cancels the variance away.
// Work is split into fixed chunks of pixels and partial sums are combined in a fixed order: results
// do not depend on the number of threads.
//
// Layout: x is (B, H, W, C) in memory (a channels-last (B, C, H, W) tensor), seen here as (B, N, C)
// with N = H*W; mean and rstd are (B, G) fp32; weight and bias are (C,) fp32.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kChunk = 64;  // pixels per task; fixed so that the reduction order is fixed

using denoiser::to_float;  // float, or bf16 bits
inline void from_float(float v, float* out) { *out = v; }
inline void from_float(float v, uint16_t* out) { *out = denoiser::float_to_bf16(v); }

// exp for the sigmoid: Cephes' single-precision polynomial (about 1 ulp), written so that the
// compiler vectorises it; NaN propagates.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  int32_t bits = (int32_t(n) + 127) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof(s));
  return e * s;
}

inline float sigmoid(float z) { return 1.0f / (1.0f + exp_approx(-z)); }

#if defined(__AVX512F__)
// The fp32 forward on 512-bit registers: a block of up to 64 channels is swept over the chunk's pixels
// with its accumulators (pass 1) or its scale and offset (pass 2) held in registers, instead of a short
// loop over C per pixel that reloads them (10-20% faster). The same arithmetic as the loops in
// forward_impl, which other builds and bf16 run (their rounding is the compiler's: tolerance-tested).
// A block's last vector may be partial: `last` masks its lanes.

inline __m512 silu16(__m512 z) {
  const __m512 e = denoiser::exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
  return _mm512_mul_ps(z, _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}

// Pass 1 for NV vectors of channels over npix pixels `stride` floats apart: chunk means into mk, sums
// of squared deviations from them into m2k.
template <int NV>
void stats_block(const float* x, int64_t stride, int64_t npix, float inv, float* mk, float* m2k, __mmask16 last) {
  const auto mask = [&](int u) { return u == NV - 1 ? last : __mmask16(0xFFFF); };
  __m512 acc[NV], m2[NV];
  for (int u = 0; u < NV; ++u) acc[u] = m2[u] = _mm512_setzero_ps();
  const auto value = [&](int64_t n, int u) { return _mm512_maskz_loadu_ps(mask(u), x + n * stride + 16 * u); };
  for (int64_t n = 0; n < npix; ++n)
    for (int u = 0; u < NV; ++u) acc[u] = _mm512_add_ps(acc[u], value(n, u));
  for (int u = 0; u < NV; ++u) acc[u] = _mm512_mul_ps(acc[u], _mm512_set1_ps(inv));
  for (int64_t n = 0; n < npix; ++n)
    for (int u = 0; u < NV; ++u) {
      const __m512 d = _mm512_sub_ps(value(n, u), acc[u]);
      m2[u] = _mm512_fmadd_ps(d, d, m2[u]);
    }
  for (int u = 0; u < NV; ++u) {
    _mm512_mask_storeu_ps(mk + 16 * u, mask(u), acc[u]);
    _mm512_mask_storeu_ps(m2k + 16 * u, mask(u), m2[u]);
  }
}

// Pass 2 for NV vectors of channels: y = x * a + k, then SiLU; y rows `y_stride` floats apart.
template <int NV, bool SILU>
void normalize_block(const float* x, int64_t stride, int64_t npix, const float* a, const float* k, float* y,
                     int64_t y_stride, __mmask16 last) {
  const auto mask = [&](int u) { return u == NV - 1 ? last : __mmask16(0xFFFF); };
  __m512 av[NV], kv[NV];
  for (int u = 0; u < NV; ++u) {
    av[u] = _mm512_maskz_loadu_ps(mask(u), a + 16 * u);
    kv[u] = _mm512_maskz_loadu_ps(mask(u), k + 16 * u);
  }
  for (int64_t n = 0; n < npix; ++n)
    for (int u = 0; u < NV; ++u) {
      const __m512 v = _mm512_maskz_loadu_ps(mask(u), x + n * stride + 16 * u);
      __m512 z = _mm512_fmadd_ps(v, av[u], kv[u]);
      if constexpr (SILU) z = silu16(z);
      _mm512_mask_storeu_ps(y + n * y_stride + 16 * u, mask(u), z);
    }
}

// Calls f.template operator()<NV>(cb, last) for blocks of up to 4 vectors (64 channels) from channel cb,
// covering `channels`; `last` masks the lanes of the block's last vector that are channels.
template <typename F>
inline void channel_blocks(int64_t channels, const F& f) {
  const int64_t vectors = (channels + 15) / 16;
  for (int64_t v0 = 0; v0 < vectors; v0 += 4) {
    const int64_t nv = std::min<int64_t>(4, vectors - v0);
    const int64_t rest = channels - (v0 + nv - 1) * 16;  // channels in the block's last vector, 1..16
    const __mmask16 last = rest >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rest) - 1);
    switch (nv) {
      case 4: f.template operator()<4>(v0 * 16, last); break;
      case 3: f.template operator()<3>(v0 * 16, last); break;
      case 2: f.template operator()<2>(v0 * 16, last); break;
      default: f.template operator()<1>(v0 * 16, last); break;
    }
  }
}
#endif

struct Shape {
  int64_t B, N, C, G, D;  // batch, pixels, channels, groups, channels per group
  int64_t chunks;         // ceil(N / kChunk)
};

Shape check(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t groups) {
  TORCH_CHECK(x.dim() == 4, "group_norm_nhwc: expected a (B, C, H, W) tensor, got ", x.dim(), " dims");
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast), "group_norm_nhwc: x must be channels-last");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "group_norm_nhwc: x must be float32 or bfloat16, got ", x.scalar_type());
  const int64_t C = x.size(1);
  TORCH_CHECK(groups > 0 && C % groups == 0, "group_norm_nhwc: groups must divide channels");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat &&
                  weight.is_contiguous() && bias.is_contiguous() && weight.numel() == C && bias.numel() == C,
              "group_norm_nhwc: weight and bias must be contiguous float32 of size C");
  const int64_t N = x.size(2) * x.size(3);
  return Shape{x.size(0), N, C, groups, C / groups, (N + kChunk - 1) / kChunk};
}

// Runs stage1(i, k) for every chunk k of image i, then finish(i), then stage2(i, k) for every chunk.
// With at least as many images as threads, one thread takes whole images, so the second pass finds
// the image still in its L2 cache; otherwise chunks are spread over threads. Either way the
// arithmetic and its order are the same.
template <typename F1, typename F2, typename F3>
void two_pass(const Shape& s, const F1& stage1, const F2& finish, const F3& stage2) {
  if (s.B >= at::get_num_threads()) {
    at::parallel_for(0, s.B, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t k = 0; k < s.chunks; ++k) stage1(i, k);
        finish(i);
        for (int64_t k = 0; k < s.chunks; ++k) stage2(i, k);
      }
    });
    return;
  }
  at::parallel_for(0, s.B * s.chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) stage1(t / s.chunks, t % s.chunks);
  });
  for (int64_t i = 0; i < s.B; ++i) finish(i);
  at::parallel_for(0, s.B * s.chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) stage2(t / s.chunks, t % s.chunks);
  });
}

// Pixels [k * kChunk, chunk_end(s, k)) form chunk k.
inline int64_t chunk_end(const Shape& s, int64_t k) { return std::min(s.N, (k + 1) * kChunk); }
inline double chunk_size(const Shape& s, int64_t k) { return double(chunk_end(s, k) - k * kChunk); }

// y = x * A + K per (image, channel): A = rstd * w, K = b - mean * rstd * w, for group g of image i.
inline void affine(const Shape& s, int64_t i, int64_t g, float mean, float rstd, const float* w, const float* b,
                   float* A, float* K) {
  for (int64_t c = g * s.D; c < (g + 1) * s.D; ++c) {
    A[i * s.C + c] = rstd * w[c];
    K[i * s.C + c] = b[c] - mean * A[i * s.C + c];
  }
}

// Sum of the per-chunk partials of image i, channel c, in chunk order.
inline double chunk_sum(const std::vector<float>& part, const Shape& s, int64_t i, int64_t c) {
  double t = 0.0;
  for (int64_t k = 0; k < s.chunks; ++k) t += part[(i * s.chunks + k) * s.C + c];
  return t;
}

// T is float or uint16_t (bf16 bits, so that the compiler sees plain integer loads and vectorises);
// SILU is a template argument so that the inner loops have no branch.
template <typename T, bool SILU>
void forward_impl(const Shape& s, const T* x, const float* w, const float* b, double eps, T* y, float* mean,
                  float* rstd) {
  const int64_t N = s.N, C = s.C;
  std::vector<float> part1(s.B * s.chunks * C), part2(s.B * s.chunks * C), A(s.B * C), K(s.B * C);
  // Pass 1: per (image, chunk, channel) mean and sum of squared deviations from it; the chunk
  // (64 pixels) is read twice while it sits in L1, so no large value is ever squared.
  auto stats = [&](int64_t i, int64_t k) {
    float* mk = part1.data() + (i * s.chunks + k) * C;
    float* m2k = part2.data() + (i * s.chunks + k) * C;
    const int64_t n0 = k * kChunk, n1 = chunk_end(s, k);
    const float inv = 1.0f / float(n1 - n0);
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      channel_blocks(C, [&]<int NV>(int64_t cb, __mmask16 last) {
        stats_block<NV>(x + (i * N + n0) * C + cb, C, n1 - n0, inv, mk + cb, m2k + cb, last);
      });
      return;
    }
#endif
    std::fill(mk, mk + C, 0.0f);
    std::fill(m2k, m2k + C, 0.0f);
    for (int64_t n = n0; n < n1; ++n) {
      const T* row = x + (i * N + n) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) mk[c] += to_float(row[c]);
    }
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) mk[c] *= inv;
    for (int64_t n = n0; n < n1; ++n) {
      const T* row = x + (i * N + n) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float d = to_float(row[c]) - mk[c];
        m2k[c] += d * d;
      }
    }
  };
  // Chunks, then the channels of each group, combined in double with the parallel-variance formula
  // (Chan et al.): M2 = sum of the parts' M2 + sum of n_part * (mean_part - mean)^2.
  auto finish = [&](int64_t i) {
    std::vector<double> mean_c(s.D), m2_c(s.D);
    for (int64_t g = 0; g < s.G; ++g) {
      double mg = 0.0, m2 = 0.0;
      for (int64_t j = 0; j < s.D; ++j) {
        const int64_t c = g * s.D + j;
        double mc = 0.0, m2c = 0.0;
        for (int64_t k = 0; k < s.chunks; ++k) mc += double(part1[(i * s.chunks + k) * C + c]) * chunk_size(s, k);
        mc /= N;
        for (int64_t k = 0; k < s.chunks; ++k) {
          const double d = double(part1[(i * s.chunks + k) * C + c]) - mc;
          m2c += double(part2[(i * s.chunks + k) * C + c]) + chunk_size(s, k) * d * d;
        }
        mean_c[j] = mc;
        m2_c[j] = m2c;
        mg += mc;
      }
      mg /= s.D;
      for (int64_t j = 0; j < s.D; ++j) m2 += m2_c[j] + N * (mean_c[j] - mg) * (mean_c[j] - mg);
      mean[i * s.G + g] = float(mg);
      rstd[i * s.G + g] = float(1.0 / std::sqrt(m2 / double(N * s.D) + eps));
      affine(s, i, g, mean[i * s.G + g], rstd[i * s.G + g], w, b, A.data(), K.data());
    }
  };
  // Pass 2: y = x * A + K, then SiLU.
  auto normalize = [&](int64_t i, int64_t k) {
    const float *a = A.data() + i * C, *kk = K.data() + i * C;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      const int64_t n0 = k * kChunk, n1 = chunk_end(s, k);
      channel_blocks(C, [&]<int NV>(int64_t cb, __mmask16 last) {
        normalize_block<NV, SILU>(x + (i * N + n0) * C + cb, C, n1 - n0, a + cb, kk + cb, y + (i * N + n0) * C + cb,
                                  C, last);
      });
      return;
    }
#endif
    for (int64_t n = k * kChunk; n < chunk_end(s, k); ++n) {
      const T* row = x + (i * N + n) * C;
      T* out = y + (i * N + n) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        float z = to_float(row[c]) * a[c] + kk[c];
        if constexpr (SILU) z = z * sigmoid(z);
        from_float(z, out + c);
      }
    }
  };
  two_pass(s, stats, finish, normalize);
}

// The gradient at the GroupNorm output: dy itself, or through SiLU (z recomputed from x).
template <bool SILU>
inline float grad_z(float dy, float z) {
  if constexpr (!SILU) {
    return dy;
  } else {
    const float sg = sigmoid(z);
    return dy * sg * (1.0f + z * (1.0f - sg));
  }
}

template <typename T, bool SILU>
void backward_impl(const Shape& s, const T* dy, const T* x, const float* w, const float* b, const float* mean,
                   const float* rstd, T* dx, float* dw, float* db) {
  const int64_t N = s.N, C = s.C;
  std::vector<float> A(s.B * C), K(s.B * C), M(s.B * C), C1(s.B * C), C2(s.B * C);
  for (int64_t i = 0; i < s.B; ++i)
    for (int64_t g = 0; g < s.G; ++g) {
      affine(s, i, g, mean[i * s.G + g], rstd[i * s.G + g], w, b, A.data(), K.data());
      std::fill(M.begin() + i * C + g * s.D, M.begin() + i * C + (g + 1) * s.D, mean[i * s.G + g]);
    }
  std::vector<float> part1(s.B * s.chunks * C), part2(s.B * s.chunks * C);
  std::vector<double> dw_img(s.B * C), db_img(s.B * C);  // per image; summed over images in order below
  // Pass 1: per (image, chunk, channel) sums of dz and dz * (x - mean).
  auto sums = [&](int64_t i, int64_t k) {
    const float *a = A.data() + i * C, *kk = K.data() + i * C, *m = M.data() + i * C;
    float* s1 = part1.data() + (i * s.chunks + k) * C;
    float* s2 = part2.data() + (i * s.chunks + k) * C;
    std::fill(s1, s1 + C, 0.0f);
    std::fill(s2, s2 + C, 0.0f);
    for (int64_t n = k * kChunk; n < chunk_end(s, k); ++n) {
      const T* xr = x + (i * N + n) * C;
      const T* gr = dy + (i * N + n) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xv = to_float(xr[c]);
        const float dz = grad_z<SILU>(to_float(gr[c]), xv * a[c] + kk[c]);
        s1[c] += dz;
        s2[c] += dz * (xv - m[c]);
      }
    }
  };
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dz * w, means over the group:
  // dx = A * dz + c1 * (x - mean) + c2.
  const double inv_n = 1.0 / double(N * s.D);
  auto finish = [&](int64_t i) {
    for (int64_t g = 0; g < s.G; ++g) {
      const double r = rstd[i * s.G + g];
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t c = g * s.D; c < (g + 1) * s.D; ++c) {
        const double sdz = chunk_sum(part1, s, i, c), sdzx = chunk_sum(part2, s, i, c);
        db_img[i * C + c] = sdz;
        dw_img[i * C + c] = sdzx * r;
        sum_g += w[c] * sdz;
        sum_gx += w[c] * sdzx;
      }
      const float c1 = float(-sum_gx * r * r * r * inv_n), c2 = float(-sum_g * r * inv_n);
      for (int64_t c = g * s.D; c < (g + 1) * s.D; ++c) {
        C1[i * C + c] = c1;
        C2[i * C + c] = c2;
      }
    }
  };
  auto input_grad = [&](int64_t i, int64_t k) {
    const float *a = A.data() + i * C, *kk = K.data() + i * C, *m = M.data() + i * C;
    const float *c1 = C1.data() + i * C, *c2 = C2.data() + i * C;
    for (int64_t n = k * kChunk; n < chunk_end(s, k); ++n) {
      const T* xr = x + (i * N + n) * C;
      const T* gr = dy + (i * N + n) * C;
      T* out = dx + (i * N + n) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xv = to_float(xr[c]);
        const float dz = grad_z<SILU>(to_float(gr[c]), xv * a[c] + kk[c]);
        from_float(a[c] * dz + c1[c] * (xv - m[c]) + c2[c], out + c);
      }
    }
  };
  two_pass(s, sums, finish, input_grad);
  for (int64_t c = 0; c < C; ++c) {
    double tw = 0.0, tb = 0.0;
    for (int64_t i = 0; i < s.B; ++i) {
      tw += dw_img[i * C + c];
      tb += db_img[i * C + c];
    }
    dw[c] = float(tw);
    db[c] = float(tb);
  }
}

template <typename T, bool SILU>
void forward_typed(const Shape& s, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                   at::Tensor& y, at::Tensor& mean, at::Tensor& rstd) {
  forward_impl<T, SILU>(s, static_cast<const T*>(x.const_data_ptr()), w.const_data_ptr<float>(),
                        b.const_data_ptr<float>(), eps, static_cast<T*>(y.mutable_data_ptr()),
                        mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>());
}

template <typename T, bool SILU>
void backward_typed(const Shape& s, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& b, const at::Tensor& mean, const at::Tensor& rstd, at::Tensor& dx,
                    at::Tensor& dw, at::Tensor& db) {
  backward_impl<T, SILU>(s, static_cast<const T*>(dy.const_data_ptr()), static_cast<const T*>(x.const_data_ptr()),
                         w.const_data_ptr<float>(), b.const_data_ptr<float>(), mean.const_data_ptr<float>(),
                         rstd.const_data_ptr<float>(), static_cast<T*>(dx.mutable_data_ptr()),
                         dw.mutable_data_ptr<float>(), db.mutable_data_ptr<float>());
}

}  // namespace

namespace denoiser {

// x (B, C, H, W) channels-last fp32/bf16, weight and bias (C,) fp32 -> (y like x, mean (B, G), rstd (B, G)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_nhwc_forward(const at::Tensor& x, const at::Tensor& weight,
                                                                       const at::Tensor& bias, int64_t groups,
                                                                       double eps, bool silu) {
  const Shape s = check(x, weight, bias, groups);
  at::Tensor y = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  at::Tensor mean = at::empty({s.B, s.G}, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({s.B, s.G}, x.options().dtype(at::kFloat));
  if (y.numel() == 0) return {y, mean, rstd};
  const bool f32 = x.scalar_type() == at::kFloat;
  if (f32 && silu) forward_typed<float, true>(s, x, weight, bias, eps, y, mean, rstd);
  if (f32 && !silu) forward_typed<float, false>(s, x, weight, bias, eps, y, mean, rstd);
  if (!f32 && silu) forward_typed<uint16_t, true>(s, x, weight, bias, eps, y, mean, rstd);
  if (!f32 && !silu) forward_typed<uint16_t, false>(s, x, weight, bias, eps, y, mean, rstd);
  return {y, mean, rstd};
}

// -> (dx like x, dweight (C,), dbias (C,)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_nhwc_backward(const at::Tensor& dy, const at::Tensor& x,
                                                                        const at::Tensor& weight,
                                                                        const at::Tensor& bias,
                                                                        const at::Tensor& mean,
                                                                        const at::Tensor& rstd, int64_t groups,
                                                                        bool silu) {
  const Shape s = check(x, weight, bias, groups);
  TORCH_CHECK(dy.sizes() == x.sizes(), "group_norm_nhwc_backward: dy must have x's shape, got ", dy.sizes(),
              " and ", x.sizes());
  TORCH_CHECK(mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat && mean.numel() == s.B * s.G &&
                  rstd.numel() == s.B * s.G,
              "group_norm_nhwc_backward: mean and rstd must be float32 with B * groups elements");
  const at::Tensor g = dy.contiguous(at::MemoryFormat::ChannelsLast).to(x.scalar_type());
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  at::Tensor dw = at::zeros({s.C}, weight.options());
  at::Tensor db = at::zeros({s.C}, weight.options());
  if (x.numel() == 0) return {dx, dw, db};
  const at::Tensor m = mean.contiguous(), r = rstd.contiguous();
  const bool f32 = x.scalar_type() == at::kFloat;
  if (f32 && silu) backward_typed<float, true>(s, g, x, weight, bias, m, r, dx, dw, db);
  if (f32 && !silu) backward_typed<float, false>(s, g, x, weight, bias, m, r, dx, dw, db);
  if (!f32 && silu) backward_typed<uint16_t, true>(s, g, x, weight, bias, m, r, dx, dw, db);
  if (!f32 && !silu) backward_typed<uint16_t, false>(s, g, x, weight, bias, m, r, dx, dw, db);
  return {dx, dw, db};
}

}  // namespace denoiser

TORCH_LIBRARY(denoiser, m) {
  m.def("group_norm_nhwc_forward(Tensor x, Tensor weight, Tensor bias, int groups, float eps, bool silu)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("group_norm_nhwc_backward(Tensor dy, Tensor x, Tensor weight, Tensor bias, Tensor mean, Tensor rstd,"
        " int groups, bool silu) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(denoiser, CPU, m) {
  m.impl("group_norm_nhwc_forward", &denoiser::group_norm_nhwc_forward);
  m.impl("group_norm_nhwc_backward", &denoiser::group_norm_nhwc_backward);
}
