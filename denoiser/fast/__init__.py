"""The optional speed layer: everything here makes the model faster. The kernels compute the model's function up to
float32 rounding (Winograd's convolution rounds differently from torch's, within 2e-5 of the output's scale); bf16
autocast or the bf16 mix, where the machine's precision decision takes one, moves the predicted noise by up to about
0.02-0.06 (docs/speed.md, bench/precision_mix.md).

The model files (`denoiser.model.attention`, `denoiser.model.attention_blocks`, `denoiser.model.groupnorm`, `denoiser.model.unet`) are written once, readably, with
torch's own modules and ops; each piece below is a switch or a wrapper around them, kept because an interleaved
A/B showed it pays on a CPU (`bench/fast_path_ab.py`, bench/NOTES.md), and tested against the reference where
it is compiled:

- `precision.py`  the precision inference runs in, decided once per machine by whole UNet calls: float32, the bf16
                  mix or bf16 autocast, a bf16 path only at 1.15x or more (every door through `sampling_context`)
- `mixed.py`      the per-op bf16 mix (the products in bf16, the rest float32)
- `batch_invariant.py` batch invariance: the timestep path's rows one at a time and the RGB convolutions one image at a
                  time, so an image's pixels never depend on its batch (every door through `sampling_context`)
- `kernels.py`    builds (at install) and loads denoiser's C++ extension from `csrc/`; `tracing()`
- `attention.py`  the small-head attention kernel behind `denoiser.model.attention.fused_attention`
- `groupnorm.py`  the channels-last GroupNorm(+SiLU) kernel behind `denoiser.model.groupnorm.group_norm`
- `winograd.py`   3x3 convolutions by Winograd's F(4x4, 3x3) for float32 CPU inference: `use_winograd(unet)` swaps
                  the class of the UNet's `nn.Conv2d`s (every door through `sampling_context`)
- `malloc.py`     glibc malloc settings for a process that allocates the same large blocks every step

The GroupNorm and attention kernels sit behind a switch in the module that owns the math (`GroupNorm.fast`,
`MultiHeadAttention.fused_attn`), which is why those two model files import from here; `denoiser.model.unet` imports
nothing from here and keeps torch's `nn.Conv2d`, which the sampling doors swap for Winograd's subclass.
Without a compiler, or with DENOISER_KERNELS=0, the reference paths run and only speed and that rounding change.
Convolution weights packed once for oneDNN were here too, until a whole Generate measured them 4.5-5 % slower
(bench/generate_ab.md); packed once in bf16 (sparing autocast's per-call weight casts too), a quiet whole Generate
measured 0.97x (cifar10) and 1.03x (emoji) on a Zen 5 (bench/precision_mix.md): not the 5 % a piece must pay.
"""
