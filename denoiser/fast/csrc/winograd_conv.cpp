// A 3x3 convolution (stride 1, padding 1) on fp32 channels-last CPU tensors by Winograd's minimal filtering
// F(4x4, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016), inference only.
//
// Why: the U-Net's 3x3 convolutions are about two thirds of a CPU sampling step. Each 4x4 block of outputs
// ("tile") needs 36 multiplications per input-output channel pair instead of 144: the image's 6x6 patch is
// transformed (d -> Bᵀ d B), multiplied elementwise by the transformed filter (g -> G g Gᵀ, done once per
// weight in denoiser/fast/winograd.py), and transformed back (m -> Aᵀ m A). Summed over input channels, the
// elementwise products are 36 matrix products: (tiles, C) x (C, K) for each of the 36 positions.
//
// Blocked: one task takes T tiles at a time (T chosen so its 36 x T x (C + K) floats stay in a core's L2),
// transforms them into V (36, T, C), runs the 36 matrix products with torch's bmm into M (36, T, K), and
// transforms M back into the output rows, + bias. Transforming the whole image first and multiplying after
// sends 2.25x the input through memory twice, which made it slower than oneDNN on 32x32 feature maps.
//
// Batch-invariant: a block never holds tiles of two images, and every image is cut into the same blocks of T
// rows (the last one padded with zero rows), so an image's pixels come out of the same bmm calls on the same
// numbers whatever the batch. Blocks that straddled images, or a T that followed the batch's size, gave bmm
// calls of other row counts, whose rows MKL rounds differently: the same image then moved by a float32 ulp
// with the batch size, and now and then a PNG pixel by 1/255.
//
// Same function as torch.nn.functional.conv2d(x, w, b, padding=1), rounding differs: the transforms' constants
// (up to 8) make its float32 error about 8x direct convolution's (tests/fast/test_winograd.py bounds it against
// float64). The channel loops are written in groups of 16 so the compiler vectorizes them on any x86 or Arm.
//
// bfloat16 products (the per-op mix, denoiser/fast/mixed.py): given U in bfloat16, V and M are kept in bfloat16 and
// the 36 products run as a bf16 bmm (float32 accumulation inside oneDNN), 2.4-2.9x the float32 bmm's rate on a
// CPU with avx512_bf16; x, the transforms' arithmetic, the bias and the output stay float32.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kA = 6;   // input patch and transformed tile: 6x6
constexpr int kM = 4;   // output tile: 4x4
constexpr int kL = 16;  // channels per vector step
constexpr int64_t kBlockBytes = 1 << 20;  // V and M of one block: about a core's L2

// float <-> the bfloat16 a buffer of c10::BFloat16 holds (round to nearest even), branch-free so loops vectorize.
inline void store(float* dst, float v) { *dst = v; }
inline void store(c10::BFloat16* dst, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  const uint16_t top = uint16_t(bits >> 16);
  std::memcpy(dst, &top, 2);
}
inline float load(const float* src) { return *src; }
inline float load(const c10::BFloat16* src) {
  uint16_t top;
  std::memcpy(&top, src, 2);
  const uint32_t bits = uint32_t(top) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// Where the output tiles lie: tile p is image n, tile row th, tile column tw.
struct Tiles {
  int64_t N, H, W, tH, tW;
  void locate(int64_t p, int64_t& n, int64_t& th, int64_t& tw) const {
    n = p / (tH * tW);
    th = (p / tW) % tH;
    tw = p % tW;
  }
};

// Channels [c, c + NL) of one tile: d (its 6x6 patch, rows from `src`) -> Bᵀ d B, written to
// out[(6i + j) * stride + c] for position (i, j).
template <int NL, typename S>
inline void input_tile(const float* const src[kA][kA], int64_t c, S* out, int64_t stride) {
  float d[kA][kA][NL], t[kA][kA][NL];
  for (int i = 0; i < kA; ++i)
    for (int j = 0; j < kA; ++j)
      for (int l = 0; l < NL; ++l) d[i][j][l] = src[i][j][c + l];
  for (int j = 0; j < kA; ++j)  // t = Bᵀ d, column by column
    for (int l = 0; l < NL; ++l) {
      const float d0 = d[0][j][l], d1 = d[1][j][l], d2 = d[2][j][l], d3 = d[3][j][l], d4 = d[4][j][l], d5 = d[5][j][l];
      t[0][j][l] = 4 * d0 - 5 * d2 + d4;
      t[1][j][l] = -4 * (d1 + d2) + d3 + d4;
      t[2][j][l] = 4 * (d1 - d2) - d3 + d4;
      t[3][j][l] = -2 * (d1 - d3) - d2 + d4;
      t[4][j][l] = 2 * (d1 - d3) - d2 + d4;
      t[5][j][l] = 4 * d1 - 5 * d3 + d5;
    }
  for (int i = 0; i < kA; ++i) {  // (Bᵀ d) B, row by row
    float y[kA][NL];  // computed whole, then stored: six strided stores in one loop kept gcc from vectorizing it
    for (int l = 0; l < NL; ++l) {
      const float r0 = t[i][0][l], r1 = t[i][1][l], r2 = t[i][2][l], r3 = t[i][3][l], r4 = t[i][4][l], r5 = t[i][5][l];
      y[0][l] = 4 * r0 - 5 * r2 + r4;
      y[1][l] = -4 * (r1 + r2) + r3 + r4;
      y[2][l] = 4 * (r1 - r2) - r3 + r4;
      y[3][l] = -2 * (r1 - r3) - r2 + r4;
      y[4][l] = 2 * (r1 - r3) - r2 + r4;
      y[5][l] = 4 * r1 - 5 * r3 + r5;
    }
    for (int j = 0; j < kA; ++j)
      for (int l = 0; l < NL; ++l) store(out + (i * kA + j) * stride + c + l, y[j][l]);
  }
}

// Channels [k, k + NL) of one tile: m (6x6 positions, m[(6i + j) * stride + k]) -> Aᵀ m A + bias, its
// `rows` x `cols` inside the image written to dst (row i, column j at dst[(i * W + j) * K + k]).
template <int NL, typename S>
inline void output_tile(const S* m_in, int64_t k, int64_t stride, const float* bias, float* dst, int64_t W,
                        int64_t K, int rows, int cols) {
  float m[kA][kA][NL], t[kM][kA][NL];
  for (int i = 0; i < kA; ++i)
    for (int j = 0; j < kA; ++j)
      for (int l = 0; l < NL; ++l) m[i][j][l] = load(m_in + (i * kA + j) * stride + k + l);
  for (int j = 0; j < kA; ++j)  // t = Aᵀ m, column by column
    for (int l = 0; l < NL; ++l) {
      const float a = m[1][j][l] + m[2][j][l], b = m[1][j][l] - m[2][j][l];
      const float c = m[3][j][l] + m[4][j][l], e = m[3][j][l] - m[4][j][l];
      t[0][j][l] = m[0][j][l] + a + c;
      t[1][j][l] = b + 2 * e;
      t[2][j][l] = a + 4 * c;
      t[3][j][l] = b + 8 * e + m[5][j][l];
    }
  for (int i = 0; i < rows; ++i) {  // (Aᵀ m) A, row by row
    float y[kM][NL];
    for (int l = 0; l < NL; ++l) {
      const float a = t[i][1][l] + t[i][2][l], b = t[i][1][l] - t[i][2][l];
      const float c = t[i][3][l] + t[i][4][l], e = t[i][3][l] - t[i][4][l];
      const float bk = bias ? bias[k + l] : 0.0f;
      y[0][l] = t[i][0][l] + a + c + bk;
      y[1][l] = b + 2 * e + bk;
      y[2][l] = a + 4 * c + bk;
      y[3][l] = b + 8 * e + t[i][5][l] + bk;
    }
    for (int j = 0; j < cols; ++j)
      for (int l = 0; l < NL; ++l) dst[(i * W + j) * K + k + l] = y[j][l];
  }
}

// Tiles [p0, p0 + Tb) of x (N, H, W, C) -> V (36, T, C), rows Tb..T-1 zero. Outside the image the patch reads
// `zeros` (padding 1).
template <typename S>
void input_block(const Tiles& g, const float* x, int64_t C, const float* zeros, int64_t p0, int64_t Tb, int64_t T,
                 S* V) {
  for (int64_t a = 0; a < kA * kA; ++a) std::fill(V + (a * T + Tb) * C, V + (a + 1) * T * C, S(0.0f));
  for (int64_t q = 0; q < Tb; ++q) {
    int64_t n, th, tw;
    g.locate(p0 + q, n, th, tw);
    const float* src[kA][kA];
    for (int i = 0; i < kA; ++i)
      for (int j = 0; j < kA; ++j) {
        const int64_t h = th * kM - 1 + i, w = tw * kM - 1 + j;
        src[i][j] = (h >= 0 && h < g.H && w >= 0 && w < g.W) ? x + ((n * g.H + h) * g.W + w) * C : zeros;
      }
    int64_t c = 0;
    for (; c + kL <= C; c += kL) input_tile<kL, S>(src, c, V + q * C, T * C);
    for (; c < C; ++c) input_tile<1, S>(src, c, V + q * C, T * C);
  }
}

// M (36, T, K) of tiles [p0, p0 + Tb) -> their output pixels in out (N, H, W, K), + bias.
template <typename S>
void output_block(const Tiles& g, const S* M, const float* bias, int64_t K, int64_t p0, int64_t Tb, int64_t T,
                  float* out) {
  for (int64_t q = 0; q < Tb; ++q) {
    int64_t n, th, tw;
    g.locate(p0 + q, n, th, tw);
    const int rows = int(std::min<int64_t>(kM, g.H - th * kM)), cols = int(std::min<int64_t>(kM, g.W - tw * kM));
    float* dst = out + ((n * g.H + th * kM) * g.W + tw * kM) * K;
    int64_t k = 0;
    for (; k + kL <= K; k += kL) output_tile<kL, S>(M + q * K, k, T * K, bias, dst, g.W, K, rows, cols);
    for (; k < K; ++k) output_tile<1, S>(M + q * K, k, T * K, bias, dst, g.W, K, rows, cols);
  }
}

// Every block: image n's tiles [first, first + Tb) -> V (36, T, C) -> M = V U (36, T, K) -> out, in S's precision.
template <typename S>
void run_blocks(const Tiles& g, const float* xp, const at::Tensor& u, const float* b, int64_t C, int64_t K,
                int64_t per_image, int64_t per_image_blocks, int64_t T, int64_t blocks, float* op) {
  const std::vector<float> zeros(C, 0.0f);
  const auto dtype = u.options();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<S> vbuf(kA * kA * T * C), mbuf(kA * kA * T * K);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n = blk / per_image_blocks, first = (blk % per_image_blocks) * T;  // image n's tiles [first, ...)
      const int64_t p0 = n * per_image + first, Tb = std::min(T, per_image - first);
      input_block<S>(g, xp, C, zeros.data(), p0, Tb, T, vbuf.data());
      const at::Tensor V = at::from_blob(vbuf.data(), {kA * kA, T, C}, dtype);  // (36, T, C)
      at::Tensor M = at::from_blob(mbuf.data(), {kA * kA, T, K}, dtype);        // (36, T, K)
      at::bmm_out(M, V, u);  // inside a parallel region: one thread per block
      output_block<S>(g, mbuf.data(), b, K, p0, Tb, T, op);
    }
  });
}

}  // namespace

namespace denoiser {

// x (N, C, H, W) channels-last, u (36, C, K) the transformed weight, bias (K) or None -> (N, K, H, W) channels-last.
at::Tensor winograd_conv3x3(const at::Tensor& x, const at::Tensor& u, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 4 &&
                  x.is_contiguous(at::MemoryFormat::ChannelsLast),
              "winograd_conv3x3: x must be a 4-D float32 channels-last CPU tensor");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  TORCH_CHECK((u.scalar_type() == at::kFloat || u.scalar_type() == at::kBFloat16) && u.is_contiguous() &&
                  u.dim() == 3 && u.size(0) == kA * kA && u.size(1) == C,
              "winograd_conv3x3: u must be the (36, C, K) float32 or bfloat16 weight from "
              "denoiser.fast.winograd.transform_weight");
  const int64_t K = u.size(2);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == K,
                "winograd_conv3x3: bias must be float32 with K elements");
    b = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({N, K, H, W}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  const Tiles g{N, H, W, (H + kM - 1) / kM, (W + kM - 1) / kM};
  const int64_t per_image = g.tH * g.tW;
  // T tiles per block, within one image (see the top): at most 64 (bmm's rows) and V and M in kBlockBytes (at
  // least 8 rows there: fewer leave bmm in call overhead), then evened out over the image's blocks
  const int64_t cap = std::max<int64_t>(8, std::min<int64_t>(64, kBlockBytes / (kA * kA * 4 * (C + K))));
  const int64_t per_image_blocks = (per_image + cap - 1) / cap;
  const int64_t T = (per_image + per_image_blocks - 1) / per_image_blocks;
  const int64_t blocks = N * per_image_blocks;
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  if (u.scalar_type() == at::kBFloat16)
    run_blocks<c10::BFloat16>(g, xp, u, b, C, K, per_image, per_image_blocks, T, blocks, op);
  else
    run_blocks<float>(g, xp, u, b, C, K, per_image, per_image_blocks, T, blocks, op);
  return out;
}

}  // namespace denoiser

TORCH_LIBRARY_FRAGMENT(denoiser, m) {
  m.def("winograd_conv3x3(Tensor x, Tensor u, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(denoiser, CPU, m) {
  m.impl("winograd_conv3x3", &denoiser::winograd_conv3x3);
}
