"""What each attention layer and head does, over the noise levels: distance, entropy, self-weight, ablation.

For clean images x₀ (generated, or the user's), each chosen timestep t noises them with seeded noise
(x_t = √ᾱ x₀ + √(1-ᾱ) ε) and runs the UNet once under `capture_attention`. From the captured q and k:

- mean attention distance: Σ_j w_ij · ‖p_i − p_j‖ in pixels of the full image, averaged over queries i
  (Dosovitskiy et al. 2021, ViT, Fig. 7: how far a head looks);
- entropy of each query's weights, −Σ_j w_ij log w_ij, between 0 (one key) and log N (uniform);
- self-weight w_ii: how much a pixel keeps of itself (1 means the layer passes its value through).

Queries are taken a block at a time, so no N×N matrix is built for more than `query_block` queries.
Then each layer (and each head) is switched to the identity (`identity_attention`) and the UNet called
again: `output_change` is ‖ε̂_switched − ε̂‖ / ‖ε̂‖ and `eps_mse_delta` how much the noise-prediction
MSE against the true ε grows (a held-out ε-MSE when the images are held out).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from denoiser.atomic import atomic_path
from denoiser.diffusion import Diffusion
from denoiser.model.attention import attention_scores
from denoiser.model.attention_blocks import identity_attention
from denoiser.model.attention_capture import AttentionRecord, capture_attention
from denoiser.request import BUILT_IN

__all__ = ["LayerStats", "attention_stats", "head_statistics", "write_csv", "stats_chart", "axis_range"]


@dataclass
class LayerStats:
    """One row: a layer (head = -1: its heads averaged; for ablations, all heads switched) at one timestep."""

    timestep: int
    layer: str
    head: int
    resolution: int  # H (= W) of the layer's token grid
    mean_distance: float  # pixels of the full image
    entropy: float  # nats
    max_entropy: float  # log N
    self_weight: float
    output_change: float  # ‖ε̂ with this layer/head as identity − ε̂‖ / ‖ε̂‖
    eps_mse_delta: float  # MSE(ε̂ switched, ε) − MSE(ε̂, ε)


def head_statistics(record: AttentionRecord, image_size: int, query_block: int = 256) -> dict[str, torch.Tensor]:
    """Per-head mean distance (image pixels), entropy and self-weight of one captured call, each (h,),
    averaged over the batch and all queries; `query_block` queries at a time."""
    if record.size is None:
        raise ValueError(f"layer {record.name} is not pixel attention; distances need a spatial grid")
    H, W = record.size
    q, k = record.q.float(), record.k.float()  # (B, h, N, d)
    B, h, N, _ = q.shape
    ys, xs = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    pos = torch.stack([ys.flatten(), xs.flatten()], dim=-1).float() * (image_size / H)  # (N, 2) in image pixels
    sums = {"mean_distance": torch.zeros(h), "entropy": torch.zeros(h), "self_weight": torch.zeros(h)}
    for start in range(0, N, query_block):
        stop = min(N, start + query_block)
        scores = attention_scores(q[:, :, start:stop], k, scale=record.scale)  # (B, h, Q, N)
        weights = torch.softmax(scores, dim=-1)
        dist = torch.cdist(pos[start:stop], pos)  # (Q, N)
        sums["mean_distance"] += (weights * dist).sum(-1).sum((0, 2))
        sums["entropy"] += -(weights * torch.log_softmax(scores, dim=-1)).sum(-1).sum((0, 2))
        rows = torch.arange(stop - start)
        sums["self_weight"] += weights[:, :, rows, start + rows].sum((0, 2))
    return {name: total / (B * N) for name, total in sums.items()}


@torch.inference_mode()
def attention_stats(
    unet: torch.nn.Module,
    scheduler,
    images: torch.Tensor,
    class_labels: torch.Tensor | None = None,
    timesteps: Sequence[int] = BUILT_IN["statistics_timesteps"],
    heads: bool = True,
    seed: int = 0,
    query_block: int = 256,
) -> list[LayerStats]:
    """Rows for every attention layer (head -1) and, with `heads`, every head, at every timestep.

    images: clean (B, C, H, W) in [-1, 1]; scheduler: the model's training DDPMScheduler.
    """
    T = scheduler.config.num_train_timesteps
    bad = [t for t in timesteps if not 0 <= int(t) < T]
    if bad or not timesteps:
        raise ValueError(f"timesteps must lie in 0..{T - 1}, got {list(timesteps)}")
    size = unet.config.sample_size
    if images.ndim != 4 or images.shape[1:] != (unet.config.in_channels, size, size):
        raise ValueError(f"images must be (B, {unet.config.in_channels}, {size}, {size}), got {tuple(images.shape)}")
    diffusion = Diffusion(scheduler)
    images = images.to(unet.device, unet.dtype)
    generator = torch.Generator().manual_seed(seed)
    rows: list[LayerStats] = []
    for t in (int(t) for t in timesteps):
        noise = torch.randn(images.shape, generator=generator).to(images)
        rows += _rows_at(unet, diffusion, images, noise, t, class_labels, heads, query_block)
    return rows


def _rows_at(unet, diffusion: Diffusion, images, noise, t: int, class_labels, heads: bool, query_block: int) -> list[LayerStats]:
    """One timestep: the plain call under capture, then one call per switched layer (and head)."""
    t_b = torch.full((images.shape[0],), t, dtype=torch.long, device=images.device)
    x_t = diffusion.add_noise(images, noise, t_b)
    noise = noise.float()

    def eps_hat() -> torch.Tensor:
        return diffusion.predict_eps(x_t, unet(x_t, t_b, class_labels=class_labels).sample, t_b).float()

    with capture_attention(unet) as records:
        base = eps_hat()
    base_mse = float((base - noise).pow(2).mean())

    def ablate(layer: str, head: int | None) -> dict[str, float]:
        with identity_attention(unet, [layer], None if head is None else [head]):
            eps = eps_hat()
        return {"output_change": float((eps - base).norm() / base.norm().clamp(min=1e-12)),
                "eps_mse_delta": float((eps - noise).pow(2).mean()) - base_mse}

    rows = []
    for rec in records:
        st = head_statistics(rec, unet.config.sample_size, query_block)
        common = dict(timestep=t, layer=rec.name, resolution=rec.size[0], max_entropy=math.log(rec.q.shape[2]))
        layer_means = {k: float(v.mean()) for k, v in st.items()}
        rows.append(LayerStats(head=-1, **common, **layer_means, **ablate(rec.name, None)))
        for hd in range(rec.num_heads) if heads and rec.num_heads > 1 else ():
            per_head = {k: float(v[hd]) for k, v in st.items()}
            rows.append(LayerStats(head=hd, **common, **per_head, **ablate(rec.name, hd)))
    return rows


def write_csv(rows: Sequence[LayerStats], path: str | Path) -> Path:
    """The rows as CSV (one line per timestep, layer and head), written to a temporary file and renamed."""
    path = Path(path)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(row).items()})
    return path


PANELS = (
    ("mean_distance", "mean attention distance (px)"),
    ("entropy", "entropy / log N"),
    ("self_weight", "weight on itself"),
    ("output_change", "output change when switched off"),
)


def _palette(i: int) -> tuple[int, int, int]:
    hues = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
            (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (0, 0, 0), (90, 90, 200)]
    return hues[i % len(hues)]


def axis_range(values: Sequence[float]) -> tuple[float, float]:
    """A chart's y range around its data (not from 0: lines close together stay apart), with 8 % margins."""
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi) * 0.05, 0.01)
    return lo - pad, hi + pad


def stats_chart(rows: Sequence[LayerStats], panel_size: tuple[int, int] = (480, 250)) -> Image.Image:
    """Four line charts one above the other (a line per layer, heads averaged; x = timestep, noisy on the left), each
    scaled to its data, then a legend. One column 480 pixels wide with 14-16 px text: shown on a phone's ~350 px
    the text stays ~11 px."""
    from denoiser.pictures import chart_font

    layer_rows = [r for r in rows if r.head == -1]
    layers = list(dict.fromkeys(r.layer for r in layer_rows))
    ts = sorted({r.timestep for r in layer_rows}, reverse=True)
    PW, PH = panel_size
    legend_h = 22 * ((len(layers) + 1) // 2) + 10
    img = Image.new("RGB", (PW, 4 * PH + legend_h), "white")
    draw = ImageDraw.Draw(img)
    left, right, top, bottom = 64, 14, 28, 40
    for p, (key, title) in enumerate(PANELS):
        oy = p * PH

        def value(r: LayerStats, key=key) -> float:
            return r.entropy / r.max_entropy if key == "entropy" else getattr(r, key)

        lo, hi = axis_range([value(r) for r in layer_rows])

        def px(i: int, v: float, oy=oy, lo=lo, hi=hi) -> tuple[float, float]:
            x = left + (i / max(1, len(ts) - 1)) * (PW - left - right)
            return x, oy + top + (hi - v) / (hi - lo) * (PH - top - bottom)

        draw.text((left, oy + 4), title, fill="black", font=chart_font(16))
        draw.rectangle([left, oy + top, PW - right, oy + PH - bottom], outline="black")
        for frac in (0.0, 0.5, 1.0):  # right-aligned against the axis
            v, font = lo + frac * (hi - lo), chart_font(14)
            draw.text((left - 4 - draw.textlength(f"{v:.3g}", font=font), px(0, v)[1] - 8), f"{v:.3g}", fill="black", font=font)
        for i, t in enumerate(ts):  # centred on their points; the first and last kept inside the plot's width, clear
            x, width = px(i, lo)[0], draw.textlength(str(t), font=chart_font(14))  # of the y labels
            x = min(max(x - width / 2, left), PW - right - width)
            draw.text((x, oy + PH - bottom + 3), str(t), fill="black", font=chart_font(14))
        draw.text((PW // 2 - 30, oy + PH - 19), "timestep t", fill="gray", font=chart_font(14))
        for li, layer in enumerate(layers):
            by_t = {r.timestep: value(r) for r in layer_rows if r.layer == layer}
            pts = [px(i, by_t[t]) for i, t in enumerate(ts) if t in by_t]
            if len(pts) > 1:
                draw.line(pts, fill=_palette(li), width=2)
            for x, y in pts:
                draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=_palette(li))
    for li, layer in enumerate(layers):
        x, y = 10 + (li % 2) * (PW // 2), 4 * PH + 6 + 22 * (li // 2)
        draw.rectangle([x, y + 4, x + 16, y + 14], fill=_palette(li))
        draw.text((x + 22, y), layer, fill="black", font=chart_font(15))
    return img
