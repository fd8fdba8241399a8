// The U-Net's ResBlock, pixel-attention block and upsampler, forward only, each as one op.
//
// Why: at sampling time one UNet call on a CPU is ~400 small ATen calls issued from Python, and the
// Python between them (argument parsing, module calls, dispatch checks) cost 10-15% of a step. These
// ops issue the same ATen calls, in the same order and with the same arguments, as the modules' readable
// `forward` (ResBlock in unet.py, SpatialSelfAttention in attention.py), so their outputs are
// bit-identical (tests/test_unet.py asserts it). Elementwise adds write into a tensor the op just
// created instead of allocating another, and the timestep embedding's add happens inside the second
// GroupNorm's reads: the same fp32 sums, less memory traffic.
// Inside `UNet.packed_weights()` (equal to float rounding, tested) the convolutions take weights
// prepacked for oneDNN, the residual add moves into the second convolution, the up path's skip is read
// in place instead of concatenated, and the upsampler runs as 2x2 phase convolutions.
//
// For inference on channels-last CPU tensors only (the GroupNorm kernel's domain): no autograd, no
// dropout, no attention capture; `UNet.forward` decides when they apply and otherwise runs the modules.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <ATen/Parallel.h>

#include <cstring>
#include <optional>
#include <vector>

#include "attention_small_head.h"
#include "group_norm_nhwc.h"

namespace {

// GroupNorm(cat(x, x2) + shift) (+ SiLU); x2 and shift may be null (see group_norm_nhwc.h)
at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t groups, double eps,
                bool silu, const at::Tensor* x2 = nullptr, const at::Tensor* shift = nullptr) {
  return std::get<0>(denoiser::group_norm_nhwc_forward(x, x2, shift, weight, bias, groups, eps, silu));
}

// oneDNN's convolution on a weight already in its blocked layout (what torch.compile's CPU backend
// emits); `other`, when given, is added inside the convolution (oneDNN's sum post-op).
at::Tensor conv_prepacked(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t pad,
                          const at::Tensor* other) {
  using Scalars = c10::List<std::optional<c10::Scalar>>;
  const std::vector<int64_t> padding{pad, pad}, ones{1, 1};
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  if (other == nullptr) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("mkldnn::_convolution_pointwise", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                           at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t,
                                           c10::string_view, Scalars, std::optional<c10::string_view>)>();
    return op.call(x, weight, b, padding, ones, ones, 1, "none", Scalars(), std::nullopt);
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_convolution_pointwise", "binary")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const std::optional<at::Tensor>&, at::IntArrayRef, at::IntArrayRef,
                                         at::IntArrayRef, int64_t, c10::string_view, std::optional<c10::Scalar>,
                                         std::optional<c10::string_view>, Scalars, std::optional<c10::string_view>)>();
  return op.call(x, *other, weight, b, padding, ones, ones, 1, "add", std::nullopt, std::nullopt, Scalars(),
                 std::nullopt);
}

// conv(x) (+ other), stride 1, padding k / 2: "same" for the modules' 3x3 and 1x1 convolutions (and
// one extra row and column for the upsampler's 2x2 phase convolution). A weight prepacked by
// UNet.packed_weights() skips oneDNN's per-call reorder. bias may be undefined (no bias).
at::Tensor conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                const at::Tensor* other = nullptr) {
  const int64_t pad = weight.size(2) / 2;
  if (weight.is_mkldnn()) return conv_prepacked(x, weight, bias, pad, other);
  at::Tensor y = at::conv2d(x, weight, bias, /*stride=*/1, /*padding=*/pad);
  return other == nullptr ? y : y.add_(*other);
}

// The phases of a 2x nearest upsample + 3x3 conv, computed on the low-resolution grid, woven into
// the high-resolution image: y (B, 4C, H+1, W+1) channels-last holds phase (a, b) = output pixels
// (2i+a, 2j+b) in channels [(2a+b)C, (2a+b+1)C) at (i+a, j+b) -> (B, C, 2H, 2W) channels-last.
at::Tensor interleave_phases(const at::Tensor& phases) {
  const at::Tensor y = phases.contiguous(at::MemoryFormat::ChannelsLast);  // (oneDNN returns it so already)
  const int64_t B = y.size(0), C = y.size(1) / 4, H = y.size(2) - 1, W = y.size(3) - 1;
  at::Tensor out = at::empty({B, C, 2 * H, 2 * W}, y.options(), at::MemoryFormat::ChannelsLast);
  const int64_t bytes = C * y.element_size();  // one pixel's channels of one phase, contiguous
  const char* src = static_cast<const char*>(y.const_data_ptr());
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  at::parallel_for(0, B * 2 * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {  // output row r of image n
      const int64_t n = r / (2 * H), a = (r % (2 * H)) % 2, i = (r % (2 * H)) / 2;
      for (int64_t ox = 0; ox < 2 * W; ++ox) {
        const int64_t b = ox % 2, j = ox / 2;
        const int64_t from = ((n * (H + 1) + i + a) * (W + 1) + j + b) * 4 + 2 * a + b;  // in units of C
        std::memcpy(dst + (r * 2 * W + ox) * bytes, src + from * bytes, bytes);
      }
    }
  });
  return out;
}

void check_inference(const at::Tensor& x, const char* op) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && x.requires_grad()),
              op, " is an inference op without autograd: call it under torch.no_grad() or torch.inference_mode()");
}

}  // namespace

namespace denoiser {

// ResBlock.forward: GroupNorm+SiLU -> conv, + projected timestep embedding, GroupNorm+SiLU -> conv, + skip.
// x (B, C_in, H, W) channels-last, temb (B, T) -> (B, C_out, H, W) channels-last.
// The embedding's add is done inside the second GroupNorm's reads (the same fp32 sums, never stored).
// Two options for a sampling loop with prepacked weights (equal to float rounding, not bit-identical):
// - temb_weight/temb_bias undefined: temb is already projected, (B, C_out) (UNet projects every block's
//   embedding in one matmul);
// - x2 given: the block's input is cat(x, x2) on channels (the up path's skip), read in place by the
//   first GroupNorm, and the 1x1 skip convolution is split: skip_weight over x's channels, skip_weight2
//   over x2's.
at::Tensor resblock_forward(const at::Tensor& x, const std::optional<at::Tensor>& x2, const at::Tensor& temb,
                            const at::Tensor& norm1_weight, const at::Tensor& norm1_bias,
                            const at::Tensor& conv1_weight, const at::Tensor& conv1_bias,
                            const std::optional<at::Tensor>& temb_weight, const std::optional<at::Tensor>& temb_bias,
                            const at::Tensor& norm2_weight, const at::Tensor& norm2_bias,
                            const at::Tensor& conv2_weight, const at::Tensor& conv2_bias,
                            const std::optional<at::Tensor>& skip_weight, const std::optional<at::Tensor>& skip_bias,
                            const std::optional<at::Tensor>& skip_weight2, int64_t groups, double eps) {
  check_inference(x, "resblock_forward");
  TORCH_CHECK(skip_weight.has_value() == skip_bias.has_value(),
              "resblock_forward: pass both skip_weight and skip_bias (a 1x1 conv) or neither (identity skip)");
  TORCH_CHECK(x2.has_value() == skip_weight2.has_value() && (!x2 || skip_weight),
              "resblock_forward: a second input x2 needs the split 1x1 skip convolution (skip_weight, skip_weight2)");
  TORCH_CHECK(temb_weight.has_value() == temb_bias.has_value(),
              "resblock_forward: pass both temb_weight and temb_bias, or neither (temb already projected)");
  const at::Tensor* second = x2 ? &*x2 : nullptr;
  at::Tensor h = conv(norm(x, norm1_weight, norm1_bias, groups, eps, true, second), conv1_weight, conv1_bias);
  at::Tensor t = temb_weight ? at::linear(temb, *temb_weight, *temb_bias) : temb;  // (B, C_out)
  t = t.to(at::kFloat).contiguous();
  at::Tensor skip = x;
  if (x2) {
    skip = conv(x, *skip_weight, *skip_bias);
    skip = conv(*x2, *skip_weight2, at::Tensor(), &skip);
  } else if (skip_weight) {
    skip = conv(x, *skip_weight, *skip_bias);
  }
  return conv(norm(h, norm2_weight, norm2_bias, groups, eps, true, nullptr, &t), conv2_weight, conv2_bias, &skip);
}

// Upsample.forward (2x nearest, then a 3x3 conv) as four 2x2 convolutions on the low-resolution grid,
// one per output phase, stacked into one convolution (4/9 of the multiply-adds; UNet.packed_weights()
// builds the phase weights from the 3x3 ones), then woven into place.
// x (B, C_in, H, W) channels-last, phase_weight (4 C, C_in, 2, 2) -> (B, C, 2H, 2W) channels-last.
at::Tensor upsample_forward(const at::Tensor& x, const at::Tensor& phase_weight, const at::Tensor& phase_bias) {
  check_inference(x, "upsample_forward");
  TORCH_CHECK(phase_weight.dim() == 4 && phase_weight.size(0) % 4 == 0 && phase_weight.size(2) == 2 &&
                  phase_weight.size(3) == 2,
              "upsample_forward: phase_weight must be (4 * C_out, C_in, 2, 2)");
  return interleave_phases(conv(x, phase_weight, phase_bias));
}

// SpatialSelfAttention.forward: GroupNorm -> H·W tokens -> multi-head attention (fused SDPA) -> back,
// + x. x (B, C, H, W) channels-last -> (B, C, H, W) channels-last.
at::Tensor attention_block_forward(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& norm_bias,
                                   const at::Tensor& qkv_weight, const std::optional<at::Tensor>& qkv_bias,
                                   const at::Tensor& proj_weight, const std::optional<at::Tensor>& proj_bias,
                                   int64_t num_heads,
                                   int64_t groups, double eps) {
  check_inference(x, "attention_block_forward");
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), N = H * W;
  TORCH_CHECK(num_heads > 0 && C % num_heads == 0, "attention_block_forward: num_heads must divide the channels");
  const int64_t d = C / num_heads;
  at::Tensor tokens = norm(x, norm_weight, norm_bias, groups, eps, false).reshape({B, C, N}).transpose(1, 2);  // (B, N, C)
  at::Tensor qkv = at::linear(tokens, qkv_weight, qkv_bias).reshape({B, N, 3, num_heads, d}).permute({2, 0, 3, 1, 4});  // (3, B, h, N, d)
  at::Tensor out = denoiser::small_head_attention(qkv[0], qkv[1], qkv[2]);  // (B, h, N, d), as fused_attention
  out = at::linear(out.transpose(1, 2).reshape({B, N, C}), proj_weight, proj_bias);  // (B, N, C): heads concatenated, projected
  // (B, N, C) tokens are channels-last (B, C, H, W) memory: view them so (with the usual strides even
  // for B = 1, which a later torch.cat reads to pick its output layout), then add the residual in place
  return out.view({B, H, W, C}).permute({0, 3, 1, 2}).add_(x);  // (B, C, H, W)
}

}  // namespace denoiser

TORCH_LIBRARY_FRAGMENT(denoiser, m) {
  m.def(
      "resblock_forward(Tensor x, Tensor? x2, Tensor temb, Tensor norm1_weight, Tensor norm1_bias,"
      " Tensor conv1_weight, Tensor conv1_bias, Tensor? temb_weight, Tensor? temb_bias, Tensor norm2_weight,"
      " Tensor norm2_bias, Tensor conv2_weight, Tensor conv2_bias, Tensor? skip_weight, Tensor? skip_bias,"
      " Tensor? skip_weight2, int groups, float eps) -> Tensor");
  m.def("upsample_forward(Tensor x, Tensor phase_weight, Tensor phase_bias) -> Tensor");
  m.def(
      "attention_block_forward(Tensor x, Tensor norm_weight, Tensor norm_bias, Tensor qkv_weight, Tensor? qkv_bias,"
      " Tensor proj_weight, Tensor? proj_bias, int num_heads, int groups, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(denoiser, CPU, m) {
  m.impl("resblock_forward", &denoiser::resblock_forward);
  m.impl("attention_block_forward", &denoiser::attention_block_forward);
  m.impl("upsample_forward", &denoiser::upsample_forward);
}

TORCH_LIBRARY_IMPL(denoiser, MkldnnCPU, m) {  // prepacked convolution weights are MKLDNN tensors
  m.impl("resblock_forward", &denoiser::resblock_forward);
  m.impl("upsample_forward", &denoiser::upsample_forward);
}
