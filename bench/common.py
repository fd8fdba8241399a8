"""What the benchmarks share, in one module that every bench imports (no bench imports another): the CPU's name and
instruction sets for every header, sides timed interleaved round by round, whether to time bfloat16 here, how long the
convolutions alone take in one profiled call, this CPU's GEMM rate, a training-step runner, diffusers' UNet2DModel
with a denoiser config's architecture, one sampling call's inputs, and the guidance settings' names.

The convolutions already run near this CPU's GEMM rate, so (competitor's time) / (our convolution
time) is the ratio we would reach if everything else took no time: the ceiling for any target.

Run a bench as a module from the repository root: `.venv/bin/python -m bench.NAME --help`.
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.flop_counter import FlopCounterMode

if TYPE_CHECKING:
    from diffusers import UNet2DModel

    from denoiser.sampling.guidance import Guidance

ROOT = Path(__file__).resolve().parent.parent  # the clone: weights/, configs/, bench/
WEIGHTS = ROOT / "weights"

CONV_OPS = (
    "aten::mkldnn_convolution", "aten::convolution_backward", "aten::_convolution_depthwise2d",
    "mkldnn::_convolution_pointwise",  # prepacked weights (UNet.packed_weights)
)


def conv_seconds(fn: Callable[[], object]) -> float:
    """Self CPU time of the convolution kernels (forward and backward) while `fn()` runs once."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in CONV_OPS) / 1e6


def cpu_name() -> str:
    flags = ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "").split()
        isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        return f"{name or platform.processor()} ({', '.join(isa) or 'no AVX2'})"
    return platform.processor() or platform.machine()


def bf16_timed(forced: bool) -> bool:
    """Whether a benchmark times a bfloat16 side: the CPU does bf16 natively (or cannot tell), or `--bf16` forced it.
    Elsewhere autocast emulates bf16 (0.16x float32 on an AVX2-only Zen 3, where one such side ran over 20 minutes)
    and issue 58 sets no bf16 bar."""
    from denoiser.fast.precision import native_bf16

    return forced or native_bf16() is not False


def interleaved(sides: dict, rounds: int) -> dict[object, list[float]]:
    """Seconds of each side (a callable) over `rounds` rounds, each round running every side once in turn, after a
    warm-up round that is not counted."""
    seconds: dict[object, list[float]] = {key: [] for key in sides}
    for r in range(rounds + 1):  # round 0 warms up
        for key, fn in sides.items():
            start = time.perf_counter()
            fn()
            if r:
                seconds[key].append(time.perf_counter() - start)
    return seconds


def spread(seconds: list[float]) -> str:
    """"median 12.43 s, fastest 10.98 s (10.98, 12.69, 12.63, 12.23)"."""
    return (f"median {statistics.median(seconds):.2f} s, fastest {min(seconds):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in seconds)})")


def gemm_rate(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a square matmul in `dtype` on this CPU (the practical peak)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


class Runner:
    """One training step of `model` on fixed noise: AdamW, ε-MSE, bf16 autocast or not, NCHW or channels-last."""

    def __init__(self, model: torch.nn.Module, batch: int, bf16: bool, channels_last: bool, fused_adam: bool):
        torch.manual_seed(0)
        self.model = model.train()
        self.channels_last = channels_last
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=fused_adam)
        self.bf16 = bf16
        self.x = torch.randn(batch, 3, 32, 32)
        if channels_last:
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.noise = torch.randn(batch, 3, 32, 32)
        self.t = torch.randint(0, 1000, (batch,))

    def step(self) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            pred = self.model(self.x, self.t).sample
        loss = (pred.float() - self.noise).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def flops(self) -> int:
        with FlopCounterMode(display=False) as counter:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                pred = self.model(self.x, self.t).sample
            (pred.float() - self.noise).pow(2).mean().backward()
        self.opt.zero_grad(set_to_none=True)
        return counter.get_total_flops()


def unet2d_like(config) -> UNet2DModel:
    """diffusers' UNet2DModel with denoiser UNet `config`'s architecture (unconditional: the pipelines
    pass no class labels)."""
    from diffusers import UNet2DModel

    levels = len(config.channel_mult)
    res = [config.sample_size // 2**i for i in range(levels)]
    attn = [r in config.attention_resolutions for r in res]
    channels = tuple(config.base_channels * m for m in config.channel_mult)
    heads = config.num_heads or channels[-1] // config.attention_head_dim
    torch.manual_seed(0)
    return UNet2DModel(
        sample_size=config.sample_size, in_channels=config.in_channels, out_channels=config.out_channels,
        block_out_channels=channels, layers_per_block=config.layers_per_block,
        down_block_types=tuple("AttnDownBlock2D" if a else "DownBlock2D" for a in attn),
        up_block_types=tuple("AttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn)),
        attention_head_dim=channels[-1] // heads, add_attention=config.mid_attention,
        norm_num_groups=config.norm_num_groups, norm_eps=1e-6, dropout=config.dropout,
    ).eval()  # fmt: skip


def model_inputs(model, batch: int) -> dict:
    """One sampling call's inputs: noise at a mid timestep, class 0 or the text model's prompt."""
    from denoiser.model.text import encode_prompts

    g = torch.Generator().manual_seed(0)
    size = model.unet.config.sample_size
    x = torch.randn(batch, 3, size, size, generator=g).contiguous(memory_format=torch.channels_last)
    inputs = {"sample": x, "timestep": torch.full((batch,), 500)}
    if model.unet.config.num_class_embeds:
        inputs["class_labels"] = torch.zeros(batch, dtype=torch.long)
    if model.text is not None:
        with torch.inference_mode():
            states, mask = encode_prompts(model.text.tokenizer, model.text.encoder, ["red apple"] * batch)
        inputs["encoder_hidden_states"], inputs["encoder_attention_mask"] = states, mask
    return inputs


@dataclass(frozen=True)
class Setting:
    """What a setting name asks for."""

    guidance: Guidance
    labelled: bool = True  # sampled with class labels (False: the model's "no class" row)
    guide_cost: float = 0.0  # the guide's parameters relative to the model's (autoguidance)
    off: tuple[str, ...] | None = None  # attention layers switched to the identity while sampling
    overrides: dict = field(default_factory=dict)  # scheduler config keys (timestep spacing, thresholding)
    eta: float = 0.0  # DDIM's stochasticity
    sampler: str = "ddim"  # denoiser.sampling.loop.SAMPLERS name
    steps: int | None = None  # sampling steps (None: the run's --steps)
    seed: int = 0  # image k seeded seed + k (seed-100000: another draw of the same setting, FID's own noise)

    def scheduler_config(self, base) -> dict:
        """The model's scheduler config with this setting's overrides."""
        return dict(base, **self.overrides)

    def switched_off(self, unet):
        """The context the setting samples in: its `off` layers switched to the identity, if any."""
        from denoiser.model.attention_blocks import identity_attention

        return identity_attention(unet, self.off) if self.off else contextlib.nullcontext()


def parse_setting(text: str, unet, sched) -> Setting:
    """The `Setting` of a setting name, e.g. cfg-3+spacing-trailing."""
    from denoiser.folders.model_dir import load_model
    from denoiser.model.attention import attention_layer_names
    from denoiser.sampling.guidance import Guidance, check_guide
    from denoiser.sampling.loop import make_sampler

    scale, pag, layers, guide, guide_scale, labelled, off = 1.0, 0.0, None, None, 1.0, True, None
    interval, overrides, eta, sampler, steps, seed = None, {}, 0.0, "ddim", None, 0
    for part in text.split("+"):
        part, _, where = part.partition("@")
        part, _, guide_dir = part.partition(":")
        kind, _, value = part.partition("-")
        if kind == "none":
            continue
        if kind == "uncond":
            labelled = False
        elif kind == "cfg":
            scale = float(value)
        elif kind == "pag":
            pag, layers = float(value), (tuple(where.split(",")) if where else None)
        elif kind == "int":  # int-70-550: the guidance interval in timesteps
            interval = tuple(value.split("-"))
        elif kind == "thresh":  # thresh-0.995-1.5: dynamic thresholding (ratio, max) of the scheduler's x0
            try:
                ratio, top = (float(v) for v in value.split("-"))
            except ValueError:
                raise ValueError(f"{part!r}: thresholding is thresh-RATIO-MAX, e.g. thresh-0.995-1.5") from None
            overrides.update(thresholding=True, dynamic_thresholding_ratio=ratio, sample_max_value=top)
        elif kind == "eta":  # eta-0.3: DDIM's stochasticity (0: deterministic)
            eta = float(value)
        elif kind == "spacing":  # spacing-trailing: the sampler's timestep spacing
            overrides["timestep_spacing"] = value
        elif kind == "sampler":  # sampler-unipc: a denoiser.sampling.loop.SAMPLERS name (default ddim)
            sampler = value
        elif kind == "steps":  # steps-20: this setting's step count (default: the run's --steps)
            steps = int(value)
        elif kind == "seed":  # seed-100000: image k seeded 100000 + k, another draw (FID's own noise)
            seed = int(value)
        elif kind == "off":
            off = tuple(attention_layer_names(unet)) if where == "all" else tuple(where.split(","))
        elif kind == "ag":
            guide, guide_sched = load_model(guide_dir)
            check_guide(unet, sched.config, guide, guide_sched.config)
            guide_scale = float(value)
        else:
            raise ValueError(f"unknown setting part {part!r}; use none, uncond, cfg-W, pag-S[@layers], ag-W:GUIDE, "
                             "int-LO-HI, eta-X, thresh-RATIO-MAX, spacing-NAME, sampler-NAME, steps-N, seed-S")
    cost = 0.0 if guide is None else sum(p.numel() for p in guide.parameters()) / sum(p.numel() for p in unet.parameters())
    if eta and sampler != "ddim":
        raise ValueError(f"{text!r}: eta-X is DDIM's; drop it or use sampler-ddim")
    make_sampler(sampler, sched.config)  # an unknown sampler name fails here, before any work
    return Setting(Guidance(scale, pag, layers, guide, guide_scale, interval), labelled, cost, off, overrides, eta,
                   sampler, steps, seed)
