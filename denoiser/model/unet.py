"""The attention U-Net noise predictor of Ho et al. 2020 (DDPM), as a diffusers model.

Conv ResBlocks with the timestep embedding added, a down path whose outputs are kept as skips, a
middle block (ResBlock, attention, ResBlock) and an up path that concatenates the skips back in.
Pixel self-attention (`SpatialSelfAttention`) follows the ResBlocks at the resolutions listed in
`attention_resolutions`. With `cross_attention_dim` set, each self-attention block is followed by a
cross-attention block (`SpatialCrossAttention`) whose keys and values come from a prompt's tokens,
`encoder_hidden_states` (B, L, cross_attention_dim) with `encoder_attention_mask` (B, L) marking padding:
the names and meanings of diffusers' UNet2DConditionModel (Rombach et al. 2022). Without it the model
builds no cross-attention module: its parameters, state dict and outputs are those of the plain U-Net.

`UNet` subclasses diffusers' `ModelMixin` and `ConfigMixin` (imported by name, which is what lets a
saved pipeline import it again), so `save_pretrained`/`from_pretrained`, `DDPMPipeline` and
`DDIMPipeline` work with it unchanged. Its forward returns diffusers' `UNet2DOutput`.

The network is torch's own modules (`nn.Conv2d`, `nn.Linear`) and denoiser's `GroupNorm` and attention, whose
math is torch's too; the speed layer (`denoiser.fast`) sits behind the switches of the modules that own the math
(`GroupNorm.fast`, the attention's `fused_attn`): this file imports nothing of it.

`UNet.to` drops diffusers' empty "kept in float32: []" warning during its own call: a patch of diffusers 0.42.1
that lives in `denoiser.model.diffusers_warnings`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.models.unets.unet_2d import UNet2DOutput
from torch import nn

from denoiser.model.attention_blocks import SpatialCrossAttention, SpatialSelfAttention
from denoiser.model.diffusers_warnings import quiet_empty_fp32_warning
from denoiser.model.groupnorm import GroupNorm

__all__ = ["UNet", "ResBlock", "timestep_embedding"]


def _tracing() -> bool:
    """Whether torch.compile or torch.export is tracing the call (data-dependent checks are eager-only)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


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

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        # norm1 and norm2 apply the SiLU
        h = self.conv1(self.norm1(x)) + self.temb_proj(temb)[:, :, None, None]  # temb (B, C_out, 1, 1) over pixels
        return self.conv2(self.dropout(self.norm2(h))) + self.skip(x)


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution of the down or up path: ResBlocks, each followed by attention (then cross-attention) where enabled."""

    def __init__(
        self, res: Sequence[ResBlock], attn: Sequence[nn.Module], cross: Sequence[nn.Module], resample: nn.Module | None
    ):
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)  # empty, or one per ResBlock
        self.cross = nn.ModuleList(cross) if cross else None  # None, or one per self-attention block
        self.resample = resample


class UNet(ModelMixin, ConfigMixin):
    """Noise-prediction U-Net with pixel self-attention (and cross-attention to a prompt); `UNet()` is the
    small CIFAR-10 default.

    The default (32×32×3, channels 64-128-128, 2 ResBlocks per level, attention at 16×16, 8×8 and in
    the middle) has about 6.8M parameters. `sample_size` must be divisible by 2**(levels - 1).

    diffusers' model features hold: `enable_gradient_checkpointing()` recomputes each ResBlock and
    attention block in the backward pass instead of keeping its activations; `enable_layerwise_casting`
    stores weights in a small dtype and computes in another (GroupNorms stay as they are).

    cross_attention_dim: the width D of the prompt's token vectors (a text encoder's hidden size); None (the
    default) builds no cross-attention. With it, a cross-attention block follows every self-attention block,
    heads as there, its output projection starting at zero (a model gaining it starts as the model it was).
    """

    _supports_gradient_checkpointing = True
    _skip_layerwise_casting_patterns = ["norm"]

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
        cross_attention_dim: int | None = None,
    ):
        super().__init__()
        self.gradient_checkpointing = False  # set by ModelMixin.enable_gradient_checkpointing()
        _validate(sample_size, base_channels, channel_mult, layers_per_block, norm_num_groups)
        if cross_attention_dim is not None and cross_attention_dim < 1:
            raise ValueError(f"cross_attention_dim must be a positive width (the text encoder's), got {cross_attention_dim}; "
                             "or None for a model without prompts")
        if attention_head_dim is not None:
            num_heads = None  # heads follow from each block's channels
        temb_dim = 4 * base_channels
        groups = norm_num_groups

        def block(in_ch: int, out_ch: int) -> ResBlock:
            return ResBlock(in_ch, out_ch, temb_dim, dropout, groups)

        def attention(ch: int) -> SpatialSelfAttention:
            return SpatialSelfAttention(ch, num_heads, attention_head_dim, groups)

        def cross(ch: int) -> SpatialCrossAttention | None:
            # None without prompts: nothing built (nor drawn from the random generator), nothing called
            if cross_attention_dim is None:
                return None
            return SpatialCrossAttention(ch, cross_attention_dim, num_heads, attention_head_dim, groups)

        # (channels, attention?) of each level, top to bottom: level i works at sample_size / 2**i
        levels = [(base_channels * mult, sample_size // 2**i in attention_resolutions) for i, mult in enumerate(channel_mult)]
        self.time_embed = nn.Sequential(nn.Linear(base_channels, temb_dim), nn.SiLU(), nn.Linear(temb_dim, temb_dim))
        # One extra row: the "no class" embedding, used when class_labels is None (and for label dropout).
        self.class_embed = nn.Embedding(num_class_embeds + 1, temb_dim) if num_class_embeds else None
        self.conv_in = nn.Conv2d(in_channels, base_channels, 3, padding=1)
        # Built in this order (down, middle, up): the order of the random initialisation and of the state dict.
        self.down, skip_channels = _down_path(levels, base_channels, layers_per_block, block, attention, cross)
        ch = levels[-1][0]
        self.mid_res1 = block(ch, ch)
        self.mid_attn = attention(ch) if mid_attention else None
        self.mid_cross = cross(ch) if mid_attention else None
        self.mid_res2 = block(ch, ch)
        self.up = _up_path(levels, skip_channels, layers_per_block, block, attention, cross)
        ch = levels[0][0]  # the up path ends at the top level's channels
        self.norm_out = GroupNorm(groups, ch, eps=1e-6, silu=True)
        self.conv_out = nn.Conv2d(ch, out_channels, 3, padding=1)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """ModelMixin.from_pretrained, then every tensor copied into memory torch allocated itself.

        diffusers' safetensors loader leaves parameters at unaligned addresses (`data_ptr % 64 == 44`
        was seen), and oneDNN/MKL pick other code paths for them: a loaded model then computed other
        float roundings than the one that was saved, and ran slower. A fresh copy is 64-byte aligned.
        A dtype asked for (diffusers' `torch_dtype`/`dtype`) is kept in `dtype_asked`: inference then runs in it,
        never in the precision denoiser.fast.precision would choose (as in diffusers, torch_dtype=torch.float32
        means float32).
        """
        model = super().from_pretrained(*args, **kwargs)
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.data = tensor.data.clone()
        model.dtype_asked = kwargs.get("dtype", kwargs.get("torch_dtype"))
        return model

    def _embed(self, timestep, class_labels, batch: int, device, dtype: torch.dtype) -> torch.Tensor:
        t = torch.as_tensor(timestep, device=device)
        if t.ndim > 1 or (t.ndim == 1 and t.shape[0] not in (1, batch)):
            raise ValueError(f"timestep must be a number, a 0-d tensor or a ({batch},) tensor, got shape {tuple(t.shape)}")
        t = t.reshape(-1).expand(batch)  # (B,)
        # in the input's dtype (the compute dtype), not the weights': layerwise casting stores those in fp8
        temb = self.time_embed(timestep_embedding(t, self.config.base_channels).to(dtype))  # (B, 4C)
        if self.class_embed is not None:
            null = self.config.num_class_embeds
            if class_labels is None:
                class_labels = torch.full((batch,), null, device=device, dtype=torch.long)
            class_labels = torch.as_tensor(class_labels, device=device).reshape(-1).expand(batch)
            # a data-dependent check: eager calls only (torch.compile/export trace the graph without it)
            if not _tracing():
                bad = ((class_labels < 0) | (class_labels > null)).any()  # 0-d bool, on the labels' device
                message = f"class_labels must lie in 0..{null - 1} (or {null} for 'no class')"
                if bad.device.type == "cpu":
                    if bad:
                        raise ValueError(message)
                else:  # an accelerator's labels: a device-side assert, no host sync each training step (issue 50)
                    torch._assert_async(~bad, message)
            temb = temb + self.class_embed(class_labels)
        elif class_labels is not None:
            raise ValueError("class_labels were given but this UNet has no classes (num_class_embeds is None)")
        return temb

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float | int,
        class_labels: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> UNet2DOutput | tuple[torch.Tensor]:
        """sample (B, in_channels, H, W), timestep (), (1,) or (B,) -> predicted noise (B, out_channels, H, W).

        encoder_hidden_states (B, L, cross_attention_dim): a prompt's token vectors, for a model with
        cross-attention; encoder_attention_mask (B, L): 1 (or True) for a token, 0 for padding, as in diffusers.
        Padding gets attention weight zero. No prompt (encoder_hidden_states None, L = 0, or a row of nothing
        but padding) means no condition: the cross-attention blocks add nothing to that image.
        """
        if sample.device.type == "cpu" and not torch.is_grad_enabled():  # inference on a CPU: torch's fastest CPU
            # convolutions, whatever layout the caller's weights and x are in (1.15x on a pipeline's NCHW model)
            sample = sample.contiguous(memory_format=torch.channels_last)
        temb = self._embed(timestep, class_labels, sample.shape[0], sample.device, sample.dtype)
        context, key_mask = self._context(encoder_hidden_states, encoder_attention_mask, sample.shape[0], sample.dtype)
        run = self._block  # module(*args), checkpointed when enabled
        h = self.conv_in(sample)
        skips = [h]
        for level in self.down:
            for j, resblock in enumerate(level.res):
                h = run(resblock, h, temb)
                if level.attn:
                    h = run(level.attn[j], h)
                    if level.cross is not None and context is not None:
                        h = run(level.cross[j], h, context, key_mask)
                skips.append(h)
            if level.resample is not None:
                h = level.resample(h)
                skips.append(h)
        h = run(self.mid_res1, h, temb)
        if self.mid_attn is not None:
            h = run(self.mid_attn, h)
            if self.mid_cross is not None and context is not None:
                h = run(self.mid_cross, h, context, key_mask)
        h = run(self.mid_res2, h, temb)
        for level in self.up:
            for j, resblock in enumerate(level.res):
                h = run(resblock, torch.cat([h, skips.pop()], dim=1), temb)  # (B, C + C_skip, H, W)
                if level.attn:
                    h = run(level.attn[j], h)
                    if level.cross is not None and context is not None:
                        h = run(level.cross[j], h, context, key_mask)
            if level.resample is not None:
                h = level.resample(h)
        out = self.conv_out(self.norm_out(h))  # GroupNorm + SiLU
        out = out.to(sample.dtype)  # the input's dtype (float32 from a bf16-autocast call): guidance and schedulers in it
        if not return_dict:
            return (out,)
        return UNet2DOutput(sample=out)

    def _context(
        self, encoder_hidden_states, encoder_attention_mask, batch: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The prompt's tokens in the compute dtype (B, L, D) and their key mask (B, L) bool, True = attend (None:
        every token); (None, None) for no prompt."""
        D = self.config.cross_attention_dim
        states, mask = encoder_hidden_states, encoder_attention_mask
        if states is None:
            if mask is not None:
                raise ValueError("encoder_attention_mask was given without encoder_hidden_states; pass both, or neither")
            return None, None
        if D is None:
            raise ValueError("encoder_hidden_states were given but this UNet has no cross-attention "
                             "(cross_attention_dim is None): build it with cross_attention_dim=<the text encoder's width>")
        if states.ndim != 3 or states.shape[0] != batch or states.shape[2] != D:
            raise ValueError(f"encoder_hidden_states must have shape ({batch}, L, {D}) = (batch, tokens, "
                             f"cross_attention_dim), got {tuple(states.shape)}")
        if mask is not None:
            if tuple(mask.shape) != tuple(states.shape[:2]):
                raise ValueError(f"encoder_attention_mask must have shape {tuple(states.shape[:2])} (batch, tokens) like "
                                 f"encoder_hidden_states, got {tuple(mask.shape)}")
            if mask.dtype != torch.bool:
                # a data-dependent check: eager calls only (torch.compile/export trace the graph without it)
                if not _tracing() and ((mask != 0) & (mask != 1)).any():
                    raise ValueError("encoder_attention_mask holds 1 for a token and 0 for padding (or bools); "
                                     "got other values")
                mask = mask != 0  # diffusers' meaning: 1 = keep, 0 = padding
        if states.shape[1] == 0:
            return None, None  # a prompt of no tokens: no prompt
        return states.to(dtype), mask

    def _block(self, module: nn.Module, *args: torch.Tensor) -> torch.Tensor:
        """module(*args); with gradient checkpointing on and gradients wanted, its activations are not kept
        but recomputed in the backward pass (diffusers' `_gradient_checkpointing_func`: non-reentrant)."""
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(module, *args)
        return module(*args)

    def to(self, *args, **kwargs):
        """ModelMixin.to, without diffusers' empty "kept in float32: []" warning (`denoiser.model.diffusers_warnings`)."""
        with quiet_empty_fp32_warning():
            return super().to(*args, **kwargs)


def _attention_blocks(ch: int, attention, cross, attns: list, crosses: list) -> None:
    """Appends a self-attention block at `ch` channels to `attns`, and its cross-attention block, where the
    model has one, to `crosses`."""
    attns.append(attention(ch))
    if (block := cross(ch)) is not None:
        crosses.append(block)


def _down_path(levels, base_channels: int, layers_per_block: int, block, attention, cross) -> tuple[nn.ModuleList, list[int]]:
    """The down levels (ResBlocks, attention where the level has it, a Downsample but at the bottom) and
    the channels of every output kept as a skip, conv_in's first; the up path consumes them in reverse."""
    skip_channels = [base_channels]
    ch, path = base_channels, nn.ModuleList()
    for i, (out, attends) in enumerate(levels):
        blocks, attns, crosses = [], [], []
        for _ in range(layers_per_block):
            blocks.append(block(ch, out))
            ch = out
            if attends:
                _attention_blocks(ch, attention, cross, attns, crosses)
            skip_channels.append(ch)
        last = i == len(levels) - 1
        path.append(Level(blocks, attns, crosses, None if last else Downsample(ch)))
        if not last:
            skip_channels.append(ch)
    return path, skip_channels


def _up_path(levels, skip_channels: list[int], layers_per_block: int, block, attention, cross) -> nn.ModuleList:
    """The up levels, bottom to top: layers_per_block + 1 ResBlocks, each taking one skip (popped from
    `skip_channels`) concatenated to its input, attention where the level has it, an Upsample but at the top."""
    ch, path = levels[-1][0], nn.ModuleList()
    for i, (out, attends) in reversed(list(enumerate(levels))):
        blocks, attns, crosses = [], [], []
        for _ in range(layers_per_block + 1):
            blocks.append(block(ch + skip_channels.pop(), out))
            ch = out
            if attends:
                _attention_blocks(ch, attention, cross, attns, crosses)
        path.append(Level(blocks, attns, crosses, Upsample(ch) if i > 0 else None))
    return path


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
