// Scaled dot-product attention for small heads on fp32 CPU tensors: the entry points unet_blocks.cpp
// calls directly; Python reaches them as torch.ops.denoiser.small_head_attention.
#pragma once

#include <ATen/core/Tensor.h>

namespace denoiser {

// Whether small_head_attention runs its own kernel for these inputs (fp32 CPU, d = 16 or 32, no
// autograd, AVX-512 build) rather than torch's SDPA.
bool small_head_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// softmax(q·kᵀ / √d) · v for (B, h, N, d) q, k, v (last dim contiguous) -> (B, h, N, d) over (B, N, h, d)
// memory; torch's scaled_dot_product_attention wherever the kernel does not apply.
at::Tensor small_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace denoiser
