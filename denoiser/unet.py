"""The attention U-Net noise predictor of Ho et al. 2020 (DDPM), as a diffusers model.

Conv ResBlocks with the timestep embedding added, a down path whose outputs are kept as skips, a
middle block (ResBlock, attention, ResBlock) and an up path that concatenates the skips back in.
Pixel self-attention (`SpatialSelfAttention`) follows the ResBlocks at the resolutions listed in
`attention_resolutions`.

`UNet` subclasses diffusers' `ModelMixin` and `ConfigMixin` (imported by name, which is what lets a
saved pipeline import it again), so `save_pretrained`/`from_pretrained`, `DDPMPipeline` and
`DDIMPipeline` work with it unchanged. Its forward returns diffusers' `UNet2DOutput`.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.models.unets.unet_2d import UNet2DOutput
from torch import nn

from denoiser.attention import SpatialSelfAttention
from denoiser.groupnorm import GroupNorm, fast_path_applies

__all__ = ["UNet", "ResBlock", "timestep_embedding"]


def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of (B,) timesteps -> (B, dim), as in the Transformer and DDPM."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=timesteps.device) / half)
    args = timesteps.float()[:, None] * freqs[None]  # (B, half)
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)  # (B, 2·half)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class ResBlock(nn.Module):
    """GroupNorm -> SiLU -> conv, + projected timestep embedding, GroupNorm -> SiLU -> dropout -> conv, + skip."""

    def __init__(self, in_channels: int, out_channels: int, temb_channels: int, dropout: float, groups: int):
        super().__init__()
        self.norm1 = GroupNorm(groups, in_channels, eps=1e-6, silu=True)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.temb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = GroupNorm(groups, out_channels, eps=1e-6, silu=True)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.skip = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()
        self._packed: dict[tuple, tuple] | None = None  # see UNet.packed_weights

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.norm1(x))  # norm1 and norm2 apply the SiLU
        h = h + self.temb_proj(temb)[:, :, None, None]  # (B, C_out, 1, 1) broadcast over pixels
        h = self.conv2(self.dropout(self.norm2(h)))
        return self.skip(x) + h

    def fused(
        self, x: torch.Tensor, temb: torch.Tensor, x2: torch.Tensor | None = None, temb_proj: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`forward(cat(x, x2), temb)` as one C++ op (csrc/unet_blocks.cpp), bit-identical; inference on
        channels-last CPU tensors only, where `UNet.forward` calls it. x2: the up path's skip, concatenated
        after x. Inside `UNet.packed_weights()` (equal to float rounding): x2 is read in place instead of
        concatenated, and `temb_proj`, this block's projection of temb computed beforehand, is used."""
        split = x2 is not None and self._packed is not None and isinstance(self.skip, nn.Conv2d)
        if x2 is not None and not split:
            x, x2 = torch.cat([x, x2], dim=1), None  # (B, C + C_skip, H, W)
        conv1_w, conv2_w, skip_w, skip_w2 = self._conv_weights(x, x2)
        projected = temb_proj is not None
        return torch.ops.denoiser.resblock_forward(
            x, x2, temb_proj if projected else temb, self.norm1.weight, self.norm1.bias, conv1_w, self.conv1.bias,
            None if projected else self.temb_proj.weight, None if projected else self.temb_proj.bias,
            self.norm2.weight, self.norm2.bias, conv2_w, self.conv2.bias,
            skip_w, None if skip_w is None else self.skip.bias, skip_w2, self.norm1.num_groups, self.norm1.eps,
        )  # fmt: skip

    def _conv_weights(self, x: torch.Tensor, x2: torch.Tensor | None) -> tuple:
        """conv1, conv2, skip weights and (for a second input x2) the skip weight's columns for x2's
        channels: the parameters, or inside `UNet.packed_weights()` copies reordered once per input size
        for oneDNN."""
        skip = self.skip.weight if isinstance(self.skip, nn.Conv2d) else None
        if self._packed is None:
            return self.conv1.weight, self.conv2.weight, skip, None
        key = (tuple(x.shape), None if x2 is None else x2.shape[1])
        if key not in self._packed:
            B, C1, H, W = x.shape
            full = (B, C1 + (0 if x2 is None else x2.shape[1]), H, W)
            skips = (None, None)
            if skip is not None and x2 is None:
                skips = (_pack_conv_weight(skip, 0, full), None)
            elif skip is not None:  # split over the two inputs' channels
                skips = (_pack_conv_weight(skip[:, :C1], 0, x.shape), _pack_conv_weight(skip[:, C1:], 0, x2.shape))
            self._packed[key] = (
                _pack_conv_weight(self.conv1.weight, 1, full),
                _pack_conv_weight(self.conv2.weight, 1, (B, self.conv2.in_channels, H, W)),
                *skips,
            )
        return self._packed[key]


def _pack_conv_weight(weight: torch.Tensor, padding: int, input_shape: Sequence[int]) -> torch.Tensor:
    """A stride-1 convolution weight in oneDNN's blocked layout for inputs of `input_shape` (an MKLDNN tensor)."""
    return torch.ops.mkldnn._reorder_convolution_weight(
        weight.contiguous(), [padding, padding], [1, 1], [1, 1], 1, list(input_shape)
    )


_PACKING = threading.Lock()  # guards UNet.packed_weights' user counts (a module-level lock: models deep-copy)


def _can_pack_convolutions() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_convolution_weight")


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """The fused inference path's name for `forward` (the stride-2 conv has no faster form here)."""
        return self(x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self._packed: dict[tuple, tuple] | None = None  # see UNet.packed_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` for inference on channels-last CPU tensors: inside `UNet.packed_weights()` one C++ op
        that convolves the low-resolution x with the four output phases' 2x2 kernels (`phase_weights`)
        and weaves them into place (equal to float rounding); otherwise the module."""
        if self._packed is None:
            return self(x)
        key = tuple(x.shape)
        if key not in self._packed:
            weight, bias = phase_weights(self.conv)
            self._packed[key] = (_pack_conv_weight(weight, 1, x.shape), bias)
        return torch.ops.denoiser.upsample_forward(x, *self._packed[key])


def phase_weights(conv: nn.Conv2d) -> tuple[torch.Tensor, torch.Tensor]:
    """A 3x3 conv (padding 1) after 2x nearest upsampling, as four 2x2 convs on the low-resolution grid.

    Output row 2i+a reads upsampled rows 2i+a-1, 2i+a, 2i+a+1, which are low-resolution rows i-1, i, i
    (a = 0) or i, i, i+1 (a = 1): taps reading the same row add up, leaving 2 per phase (columns alike).
    A 2x2 conv with padding 1 puts phase (a, b) of output (2i+a, 2j+b) at (i+a, j+b).
    Returns weight (4·C_out, C_in, 2, 2), phase (a, b) in rows (2a+b)·C_out.., and the bias repeated.
    """
    fold = torch.tensor([[[1, 0, 0], [0, 1, 1]], [[1, 1, 0], [0, 0, 1]]], dtype=torch.float64)  # (a, 2, 3)
    w = torch.einsum("aik,bjl,ockl->abocij", fold, fold, conv.weight.detach().double())  # (2, 2, C_out, C_in, 2, 2)
    C_out, C_in = conv.weight.shape[:2]
    return w.reshape(4 * C_out, C_in, 2, 2).to(conv.weight.dtype), conv.bias.detach().repeat(4)  # (4·C_out, C_in, 2, 2)


class Level(nn.Module):
    """One resolution of the down or up path: ResBlocks, each followed by attention where enabled."""

    def __init__(self, res: Sequence[ResBlock], attn: Sequence[nn.Module], resample: nn.Module | None):
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)  # empty, or one per ResBlock
        self.resample = resample


class UNet(ModelMixin, ConfigMixin):
    """Noise-prediction U-Net with pixel self-attention; `UNet()` is the small CIFAR-10 default.

    The default (32×32×3, channels 64-128-128, 2 ResBlocks per level, attention at 16×16, 8×8 and in
    the middle) has about 6.8M parameters. `sample_size` must be divisible by 2**(levels - 1).
    """

    @register_to_config
    def __init__(
        self,
        sample_size: int = 32,
        in_channels: int = 3,
        out_channels: int = 3,
        base_channels: int = 64,
        channel_mult: Sequence[int] = (1, 2, 2),
        layers_per_block: int = 2,
        attention_resolutions: Sequence[int] = (16, 8),
        mid_attention: bool = True,
        num_heads: int | None = 1,
        attention_head_dim: int | None = None,
        dropout: float = 0.0,
        norm_num_groups: int = 32,
        num_class_embeds: int | None = None,
    ):
        super().__init__()
        _validate(sample_size, base_channels, channel_mult, layers_per_block, norm_num_groups)
        if attention_head_dim is not None:
            num_heads = None  # heads follow from each block's channels
        temb_dim = 4 * base_channels
        groups = norm_num_groups

        def attention(ch: int) -> SpatialSelfAttention:
            return SpatialSelfAttention(ch, num_heads, attention_head_dim, groups)

        self.time_embed = nn.Sequential(nn.Linear(base_channels, temb_dim), nn.SiLU(), nn.Linear(temb_dim, temb_dim))
        # One extra row: the "no class" embedding, used when class_labels is None (and for label dropout).
        self.class_embed = nn.Embedding(num_class_embeds + 1, temb_dim) if num_class_embeds else None
        self.conv_in = nn.Conv2d(in_channels, base_channels, 3, padding=1)

        # Down path: remember every output's channels; the up path consumes them in reverse.
        skip_channels = [base_channels]
        ch, res = base_channels, sample_size
        self.down = nn.ModuleList()
        for i, mult in enumerate(channel_mult):
            blocks, attns = [], []
            for _ in range(layers_per_block):
                blocks.append(ResBlock(ch, base_channels * mult, temb_dim, dropout, groups))
                ch = base_channels * mult
                if res in attention_resolutions:
                    attns.append(attention(ch))
                skip_channels.append(ch)
            last = i == len(channel_mult) - 1
            self.down.append(Level(blocks, attns, None if last else Downsample(ch)))
            if not last:
                skip_channels.append(ch)
                res //= 2

        self.mid_res1 = ResBlock(ch, ch, temb_dim, dropout, groups)
        self.mid_attn = attention(ch) if mid_attention else None
        self.mid_res2 = ResBlock(ch, ch, temb_dim, dropout, groups)

        self.up = nn.ModuleList()
        for i, mult in reversed(list(enumerate(channel_mult))):
            blocks, attns = [], []
            for _ in range(layers_per_block + 1):
                blocks.append(ResBlock(ch + skip_channels.pop(), base_channels * mult, temb_dim, dropout, groups))
                ch = base_channels * mult
                if res in attention_resolutions:
                    attns.append(attention(ch))
            self.up.append(Level(blocks, attns, Upsample(ch) if i > 0 else None))
            if i > 0:
                res *= 2

        self.norm_out = GroupNorm(groups, ch, eps=1e-6, silu=True)
        self.conv_out = nn.Conv2d(ch, out_channels, 3, padding=1)
        # inference switch, as `fused_attn` in the attention: False always runs the modules' Python forward
        self.fused_blocks = True
        self._packed_temb: tuple | None = None  # see packed_weights
        self._packed_users = 0

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """ModelMixin.from_pretrained, then every tensor copied into memory torch allocated itself.

        diffusers' safetensors loader leaves parameters at unaligned addresses (`data_ptr % 64 == 44`
        was seen), and oneDNN/MKL pick other code paths for them: a loaded model then computed other
        float roundings than the one that was saved, and ran slower. A fresh copy is 64-byte aligned.
        """
        model = super().from_pretrained(*args, **kwargs)
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.data = tensor.data.clone()
        return model

    def _embed(self, timestep, class_labels, batch: int, device) -> torch.Tensor:
        t = torch.as_tensor(timestep, device=device)
        if t.ndim > 1 or (t.ndim == 1 and t.shape[0] not in (1, batch)):
            raise ValueError(f"timestep must be a number, a 0-d tensor or a ({batch},) tensor, got shape {tuple(t.shape)}")
        t = t.reshape(-1).expand(batch)  # (B,)
        # the first layer's dtype, not ModelMixin.dtype: that walks every submodule on each call
        dtype = self.time_embed[0].weight.dtype
        temb = self.time_embed(timestep_embedding(t, self.config.base_channels).to(dtype))  # (B, 4C)
        if self.class_embed is not None:
            null = self.config.num_class_embeds
            if class_labels is None:
                class_labels = torch.full((batch,), null, device=device, dtype=torch.long)
            class_labels = torch.as_tensor(class_labels, device=device).reshape(-1).expand(batch)
            if ((class_labels < 0) | (class_labels > null)).any():
                raise ValueError(f"class_labels must lie in 0..{null - 1} (or {null} for 'no class')")
            temb = temb + self.class_embed(class_labels)
        elif class_labels is not None:
            raise ValueError("class_labels were given but this UNet has no classes (num_class_embeds is None)")
        return temb

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float | int,
        class_labels: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> UNet2DOutput | tuple[torch.Tensor]:
        """sample (B, in_channels, H, W), timestep (), (1,) or (B,) -> predicted noise (B, out_channels, H, W)."""
        temb = self._embed(timestep, class_labels, sample.shape[0], sample.device)
        h = self.conv_in(sample)
        if self._fused_blocks_apply(h):  # the same blocks, each one C++ op (bit-identical)
            proj = self._temb_projections(temb)  # inside packed_weights(): every ResBlock's, in one matmul

            def res(block, x, x2=None):
                return block.fused(x, temb, x2, proj.get(block))

            attn, resample = (lambda block, x: block.fused(x)), (lambda m, x: m.fused(x))
        else:

            def res(block, x, x2=None):
                return block(x if x2 is None else torch.cat([x, x2], dim=1), temb)  # (B, C + C_skip, H, W)

            attn, resample = (lambda block, x: block(x)), (lambda m, x: m(x))
        skips = [h]
        for level in self.down:
            for j, block in enumerate(level.res):
                h = res(block, h)
                if level.attn:
                    h = attn(level.attn[j], h)
                skips.append(h)
            if level.resample is not None:
                h = resample(level.resample, h)
                skips.append(h)
        h = res(self.mid_res1, h)
        if self.mid_attn is not None:
            h = attn(self.mid_attn, h)
        h = res(self.mid_res2, h)
        for level in self.up:
            for j, block in enumerate(level.res):
                h = res(block, h, skips.pop())  # on cat(h, skip)
                if level.attn:
                    h = attn(level.attn[j], h)
            if level.resample is not None:
                h = resample(level.resample, h)
        out = self.conv_out(self.norm_out(h))  # GroupNorm + SiLU
        if not return_dict:
            return (out,)
        return UNet2DOutput(sample=out)

    @contextlib.contextmanager
    def packed_weights(self) -> Iterator[None]:
        """Within, the fused inference path (channels-last CPU) works on weights prepared once for a
        sampling loop (outputs equal to float rounding; ~10% of a CPU sampling step):
        - the ResBlocks' convolution weights reordered into oneDNN's blocked layout once per input size
          instead of on every call, the residual added inside the second convolution;
        - every ResBlock's timestep-embedding projection in one matmul per call;
        - the up path's skip read in place by the first GroupNorm instead of concatenated (the 1x1 skip
          convolution split over the two inputs);
        - the upsamplers as four 2x2 phase convolutions on the low-resolution grid (`phase_weights`).
        The weights must not change while it is open. It nests and may be open in several threads at
        once (the app's attention view re-runs a step while another session samples): the packs go when
        the last user leaves. A no-op where oneDNN is unavailable."""
        if not _can_pack_convolutions():
            yield
            return
        packing = [m for m in self.modules() if isinstance(m, (ResBlock, Upsample))]
        with _PACKING:
            if self._packed_users == 0:
                blocks = [m for m in packing if isinstance(m, ResBlock)]
                spans = torch.tensor([0] + [b.temb_proj.out_features for b in blocks]).cumsum(0).tolist()
                for m in packing:
                    m._packed = {}
                self._packed_temb = (
                    torch.cat([b.temb_proj.weight.detach() for b in blocks]),  # (Σ C_out, T)
                    torch.cat([b.temb_proj.bias.detach() for b in blocks]),
                    {b: (spans[i], spans[i + 1]) for i, b in enumerate(blocks)},
                )
            self._packed_users += 1
        try:
            yield
        finally:
            with _PACKING:
                self._packed_users -= 1
                if self._packed_users == 0:
                    for m in packing:
                        m._packed = None
                    self._packed_temb = None

    def _temb_projections(self, temb: torch.Tensor) -> dict[ResBlock, torch.Tensor]:
        """Inside `packed_weights()`: each ResBlock's projection of temb, (B, C_out), from one matmul."""
        if self._packed_temb is None:
            return {}
        weight, bias, spans = self._packed_temb
        t = F.linear(temb, weight, bias)  # (B, Σ C_out)
        return {block: t[:, start:stop] for block, (start, stop) in spans.items()}

    def _fused_blocks_apply(self, h: torch.Tensor) -> bool:
        """Inference where the GroupNorm kernel runs (channels-last fp32/bf16 CPU activations, fp32 norms):
        there the blocks may run as single C++ ops. Not while training (dropout), under autograd or
        autocast, or with `fused_blocks` switched off."""
        return (
            self.fused_blocks
            and not self.training
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(h.device.type)
            and fast_path_applies(h, self.norm_out.weight, self.norm_out.bias)
        )


def _validate(sample_size, base_channels, channel_mult, layers_per_block, norm_num_groups) -> None:
    factor = 2 ** (len(channel_mult) - 1)
    if not channel_mult:
        raise ValueError("channel_mult needs at least one level, e.g. [1, 2, 2]")
    if sample_size <= 0 or sample_size % factor:
        raise ValueError(
            f"sample_size must be divisible by {factor} (2**(len(channel_mult)-1)), got {sample_size}; "
            "change sample_size or use fewer levels"
        )
    if layers_per_block < 1:
        raise ValueError(f"layers_per_block must be at least 1, got {layers_per_block}")
    for mult in channel_mult:
        if (base_channels * mult) % norm_num_groups:
            raise ValueError(
                f"norm_num_groups={norm_num_groups} must divide every level's channels, "
                f"but base_channels*mult = {base_channels}*{mult} = {base_channels * mult}"
            )
