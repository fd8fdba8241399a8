// GroupNorm (+ optional SiLU) for channels-last CPU tensors: the entry points other sources call
// directly (unet_blocks.cpp); Python reaches them as torch.ops.denoiser.group_norm_nhwc_*.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace denoiser {

// x (B, C, H, W) channels-last fp32/bf16, weight and bias (C,) fp32 -> (y like x, mean (B, G), rstd (B, G)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_nhwc_forward(const at::Tensor& x, const at::Tensor& weight,
                                                                       const at::Tensor& bias, int64_t groups,
                                                                       double eps, bool silu);

// The same for the channel-wise concatenation of x and x2 (nullptr: x alone), read in place, with
// `shift` (nullptr, or (B, C) fp32) added to it first: y = GroupNorm(cat(x, x2) + shift[:, :, None, None]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_nhwc_forward(const at::Tensor& x, const at::Tensor* x2,
                                                                       const at::Tensor* shift,
                                                                       const at::Tensor& weight,
                                                                       const at::Tensor& bias, int64_t groups,
                                                                       double eps, bool silu);

// -> (dx like x, dweight (C,), dbias (C,)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_nhwc_backward(const at::Tensor& dy, const at::Tensor& x,
                                                                        const at::Tensor& weight,
                                                                        const at::Tensor& bias,
                                                                        const at::Tensor& mean,
                                                                        const at::Tensor& rstd, int64_t groups,
                                                                        bool silu);

}  // namespace denoiser
