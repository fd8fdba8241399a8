"""Pictures people would rather look at than read: attention overlays and loss curves, as PIL images.

Pure PIL and torch (no plotting library): a perceptual heat colormap, heatmaps upsampled to the
image and blended over it with the query pixel marked, a labelled panel of every self-attention layer,
a text model's word maps (one prompt word's cross-attention at every layer, at one step or every step)
and one pixel's weights over the prompt's words as bar charts, and a loss curve with log-scaled y axis.
"""

from __future__ import annotations

import functools
import io
import math
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

from denoiser.pixels import to_uint8

if TYPE_CHECKING:
    from denoiser.model.attention_capture import AttentionRecord

__all__ = [
    "heat_colormap", "overlay", "layer_label", "tiles_image", "with_colour_scale", "with_title", "attention_panel",
    "stages_panel", "word_maps", "word_maps_panel", "word_maps_grid", "token_weights", "token_weights_panel",
    "loss_curve", "word_overlay", "WORD_SCALE", "chart_font", "ChartFont", "LABEL_PX",
]

# Anchor colours of a dark-to-bright heat map (black-purple-red-orange-yellow-white), our own choice.
_HEAT = torch.tensor(
    [[0, 0, 4], [60, 15, 110], [150, 40, 100], [220, 70, 50], [250, 160, 20], [252, 255, 200]], dtype=torch.float32
) / 255.0


def heat_colormap(values: torch.Tensor) -> torch.Tensor:
    """(H, W) in [0, 1] -> (3, H, W) RGB in [0, 1], by linear interpolation between anchors."""
    v = values.clamp(0, 1) * (len(_HEAT) - 1)
    lo = v.floor().long().clamp(max=len(_HEAT) - 2)
    frac = (v - lo).unsqueeze(-1)  # (H, W, 1)
    rgb = _HEAT[lo] * (1 - frac) + _HEAT[lo + 1] * frac  # (H, W, 3)
    return rgb.permute(2, 0, 1)  # (3, H, W)


def overlay(image: torch.Tensor, heat: torch.Tensor, query: tuple[int, int] | None = None, alpha: float = 0.6,
            vmax: float | None = None) -> torch.Tensor:
    """Blend a heatmap over an image. image (3, S, S) in [0, 1]; heat (h, w) any scale -> (3, S, S).

    The heatmap is divided by `vmax` (default: its own max, so every map uses the whole colour scale) and upsampled
    (nearest: each cell is one attended pixel of the layer's grid); `query` (y, x) in image pixels is marked cyan.
    """
    S_h, S_w = image.shape[-2:]
    heat = heat.float()
    heat = heat / (heat.max().clamp(min=1e-12) if vmax is None else vmax)
    up = F.interpolate(heat[None, None], size=(S_h, S_w), mode="nearest")[0, 0]  # (S, S)
    out = (1 - alpha) * image.float() + alpha * heat_colormap(up)
    if query is not None:
        y, x = query
        out[:, y, x] = torch.tensor([0.0, 1.0, 1.0])
    return out.clamp(0, 1)


def layer_label(record: AttentionRecord) -> str:
    """'down.1.attn.0 (16x16)': the layer's module name (what `--pag-layers`, `attention-stats` and the Heads tab
    call it) and its grid."""
    size = f"{record.size[0]}x{record.size[1]}" if record.size else f"{record.q.shape[2]} tokens"
    return f"{record.name} ({size})"


# characters Pillow's bundled font (what every machine has) lacks, spelled so a chart never draws a missing-glyph box:
# "red ×1.5" is drawn "red x1.5"; accented letters without their accents; any other (another script) as "?"
_SPELLED = {"×": "x", "→": "->", "≈": "~", "σ": "sigma", "…": "...", "“": '"', "”": '"', "–": "-", "—": "-",
            **{chr(0x2080 + i): str(i) for i in range(10)}}


class ChartFont(ImageFont.FreeTypeFont):
    """Pillow's default font, drawing every text it is given: what it lacks spelled (`drawable`)."""

    def drawable(self, text: str) -> str:
        return "".join(c if self.has(c) else self._spelled(c) for c in str(text))

    def _spelled(self, char: str) -> str:
        """A character the font lacks: spelled (_SPELLED), else its letters without accents ("é" -> "e", by Unicode's
        compatibility decomposition), else "?"."""
        if char in _SPELLED:
            return _SPELLED[char]
        base = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
        return base if base and all(self.has(c) for c in base) else "?"

    def has(self, char: str) -> bool:
        """Whether the font draws `char` (its mask differs from the missing-glyph box of a private-use character)."""
        if char.isspace() or char.isascii():
            return True
        return _has_glyph(self.size, char)

    def getmask2(self, text, *args, **kwargs):
        return super().getmask2(self.drawable(text), *args, **kwargs)

    def getlength(self, text, *args, **kwargs):
        return super().getlength(self.drawable(text), *args, **kwargs)

    def getbbox(self, text, *args, **kwargs):
        return super().getbbox(self.drawable(text), *args, **kwargs)


@functools.cache
def _has_glyph(size: float, char: str) -> bool:
    return _drawn(size, char) != _drawn(size, "\ue000")  # private use: never in the font, drawn as its missing-glyph box


@functools.cache
def _drawn(size: float, char: str) -> bytes:
    img = Image.new("L", (2 * int(size) + 4, 2 * int(size) + 4))
    ImageDraw.Draw(img).text((2, 2), char, fill=255, font=ImageFont.load_default(size=size))
    return img.tobytes()


LABEL_PX = 14  # chart and panel labels: the app page's body text, so a chart read at its drawn size (the phone page
# scrolls it sideways rather than shrinking it) is as legible as the page around it


@functools.cache
def chart_font(size: int = LABEL_PX) -> ChartFont:
    """The font every chart and panel label is drawn with (`ChartFont`), one per size."""
    return ChartFont(io.BytesIO(ImageFont.load_default(size=size).font_bytes), size)


def _to_pil(x: torch.Tensor, scale: int) -> Image.Image:
    arr = to_uint8(x).permute(1, 2, 0).numpy()  # (C, H, W) -> (H, W, C)
    img = Image.fromarray(arr)
    return img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)


def _wrap(label: str, width: float, font) -> list[str]:
    """`label` in lines no wider than `width` where its words allow (a label never runs into its neighbour's)."""
    lines: list[str] = []
    for word in label.split(" "):
        if lines and ImageDraw.Draw(Image.new("1", (1, 1))).textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def tiles_image(rows: Sequence[Sequence[tuple[str, torch.Tensor]]], scale: int, line_h: int = LABEL_PX + 3,
                pad: int = 4) -> Image.Image:
    """Labelled (3, S, S) tiles in [0, 1], one list per row, upscaled by `scale` (nearest); a label wider than its
    tile takes more lines."""
    S = rows[0][0][1].shape[-1]
    tile, font = S * scale, chart_font()
    cols = max(len(r) for r in rows)
    labels = [[_wrap(label, tile, font) for label, _ in row] for row in rows]
    label_h = line_h * max(len(lines) for row in labels for lines in row) + 5
    panel = Image.new("RGB", (cols * (tile + pad) + pad, len(rows) * (tile + label_h + pad) + pad), "white")
    draw = ImageDraw.Draw(panel)
    for r, row in enumerate(rows):
        y0 = pad + r * (tile + label_h + pad)
        for c, (_, t) in enumerate(row):
            x0 = pad + c * (tile + pad)
            draw.multiline_text((x0, y0), "\n".join(labels[r][c]), fill="black", font=font, spacing=line_h - LABEL_PX)
            panel.paste(_to_pil(t, scale), (x0, y0 + label_h))
    return panel


def with_colour_scale(panel: Image.Image, low: str, high: str, bar_h: int = 10, pad: int = 4) -> Image.Image:
    """The panel with the heat colour scale under it: a bar from the lowest colour (left, `low`) to the highest
    (right, `high`), the labels at its ends."""
    width = min(panel.width - 2 * pad, 256)
    ramp = torch.linspace(0, 1, width)[None].expand(bar_h, width)  # (bar_h, width)
    bar = _to_pil(heat_colormap(ramp), 1)
    out = Image.new("RGB", (panel.width, panel.height + bar_h + LABEL_PX + 7 + pad), "white")
    out.paste(panel, (0, 0))
    out.paste(bar, (pad, panel.height))
    draw = ImageDraw.Draw(out)
    font = chart_font()
    draw.text((pad, panel.height + bar_h + 2), low, fill="black", font=font)
    draw.text((pad + width - draw.textlength(high, font=font), panel.height + bar_h + 2), high, fill="black", font=font)
    return out


def attention_panel(
    image: torch.Tensor,
    records: Sequence[AttentionRecord],
    query: tuple[int, int],
    batch_index: int = 0,
    per_head: bool = True,
    cell: int = 96,
) -> Image.Image:
    """One row per self-attention layer: the image, the head-averaged map, then each head's map.

    `query` is (y, x) in image pixels; each layer maps it onto its own grid. Exact weights are
    rebuilt from the captured q and k. Cross-attention records (a text model's) are skipped: their
    weights are over the prompt's words, not the pixels (`token_weights_panel` draws those).
    """
    S = image.shape[-1]
    maps = []
    for rec in _of_kind(records, "self"):
        H, W = rec.size
        maps.append((layer_label(rec), rec.weights((query[0] * H // S, query[1] * W // S))[batch_index]))  # (h, H, W)
    return maps_panel(image, maps, query, per_head, cell)


def maps_panel(
    image: torch.Tensor, maps: Sequence[tuple[str, torch.Tensor]], query: tuple[int, int], per_head: bool = True, cell: int = 96
) -> Image.Image:
    """The panel of `attention_panel` from ready maps: (label, weights (h, H, W) on the layer's grid) per layer."""
    S = image.shape[-1]
    rows = []
    for label, w in maps:
        row = [(label, image), ("mean of heads", overlay(image, w.mean(0), query))]
        if per_head and w.shape[0] > 1:
            row += [(f"head {i}", overlay(image, w[i], query)) for i in range(w.shape[0])]
        rows.append(row)
    return with_colour_scale(tiles_image(rows, max(1, cell // S)), "weight 0", "each map's largest weight")


def stages_panel(image: torch.Tensor, scores: torch.Tensor, weights: torch.Tensor, query: tuple[int, int]) -> Image.Image:
    """Stage (2) and stage (3) for one query: its score map before the softmax, its weights after.

    image (3, S, S); scores, weights (H, W) on the layer's grid; query (y, x) in image pixels.
    """
    S = image.shape[-1]
    s = (scores - scores.min()) / (scores.max() - scores.min()).clamp(min=1e-12)
    score_tile = F.interpolate(heat_colormap(s)[None], size=(S, S), mode="nearest")[0]  # (3, S, S)
    row = [("scores q.k^T / sqrt(d)", score_tile), ("softmax weights", overlay(image, weights, query, alpha=0.85))]
    return with_colour_scale(tiles_image([row], max(1, 160 // S)), "lowest", "highest (each map)")


def with_title(panel: Image.Image, title: str, pad: int = 4) -> Image.Image:
    """The panel under a title (wrapped to the panel's width)."""
    font = chart_font()
    lines = _wrap(title, panel.width - 2 * pad, font)
    out = Image.new("RGB", (panel.width, panel.height + (LABEL_PX + 4) * len(lines) + pad), "white")
    ImageDraw.Draw(out).multiline_text((pad, pad), "\n".join(lines), fill="black", font=font, spacing=4)
    out.paste(panel, (0, out.height - panel.height))
    return out


def _of_kind(records: Sequence[AttentionRecord], kind: str) -> list[AttentionRecord]:
    """The records of "self" or "cross" layers; an error naming the captured layers when there are none."""
    chosen = [r for r in records if r.kind == kind]
    if not chosen:
        names = ", ".join(r.name for r in records) or "none"
        raise ValueError(f"no {kind}-attention layer was captured (captured: {names})"
                         + ("; word maps need a text model (one with cross_attention_dim)" if kind == "cross" else ""))
    return chosen


def word_maps(records: Sequence[AttentionRecord], token: int, batch_index: int = 0) -> list[tuple[str, torch.Tensor]]:
    """(layer label, (H, W) map) of prompt token `token` at every cross-attention layer: the share of each pixel's
    cross-attention that goes to the token, averaged over the heads; in [0, 1], and the words' maps sum to one."""
    return [(layer_label(r), r.token_map(token)[batch_index].mean(0)) for r in _of_kind(records, "cross")]  # (h, H, W) -> (H, W)


def _word_row(image: torch.Tensor, records: Sequence[AttentionRecord], token: int, image_label: str,
              names: bool = True) -> list:
    """The image, then the token's map over it at each cross-attention layer, on the one absolute scale
    (`word_overlay`), its label giving the lowest and highest share. names=False: the ranges alone."""
    row = [(image_label, image)]
    for label, m in word_maps(records, token):
        lo, hi = m.min().item(), m.max().item()
        row.append((f"{label if names else ''} {lo:.2f}-{hi:.2f}".strip(), word_overlay(image, m)))
    return row


def word_overlay(image: torch.Tensor, share: torch.Tensor, query: tuple[int, int] | None = None) -> torch.Tensor:
    """A word's map on one absolute colour scale, the same for every map: a pixel's share of its cross-attention that
    goes to the word, 0 (darkest) to 1 (brightest: all of it). A map that is nearly flat looks flat (two words sharing
    every pixel evenly: one colour), as attention tools draw it; each map's label gives its range:
    image (3, S, S), share (h, w) -> (3, S, S)."""
    return overlay(image, share, query, vmax=1.0)


WORD_SCALE = ("share 0", "1: all of the pixel's attention")  # the colour bar under every word map
_WORD_TITLE = "the share of each pixel's cross-attention that goes to it (mean of heads; one colour scale for every map, " \
              "the lowest and highest share in its label)"


def word_maps_panel(image: torch.Tensor, records: Sequence[AttentionRecord], token: int, word: str,
                    cell: int = 128) -> Image.Image:
    """The image and prompt word `word` (token `token`)'s map at every cross-attention layer: the down path and the
    middle in the first row, the up path in the second. image (3, S, S) in [0, 1]; records: one step's capture."""
    tiles = _word_row(image, records, token, "generated image")
    cut = next((i for i, (label, _) in enumerate(tiles) if label.startswith("up.")), len(tiles))
    rows = [tiles[:cut]] + ([[("up path:", image)] + tiles[cut:]] if cut < len(tiles) else [])
    panel = tiles_image(rows, max(1, cell // image.shape[-1]))
    return with_title(with_colour_scale(panel, *WORD_SCALE), f'where "{word}" is attended: {_WORD_TITLE}')


def word_maps_grid(steps: Sequence[tuple[str, torch.Tensor, Sequence[AttentionRecord]]], token: int, word: str,
                   cell: int = 96) -> Image.Image:
    """Rows = sampling steps, columns = cross-attention layers: (label, image (3, S, S), records) per step, each
    row's maps over its own image (e.g. that step's predicted x0). The layers are named in the first row only."""
    rows = [_word_row(image, records, token, label, names=r == 0) for r, (label, image, records) in enumerate(steps)]
    panel = tiles_image(rows, max(1, cell // steps[0][1].shape[-1]))
    title = f'where "{word}" is attended at each step (rows, first to last) and layer (columns): {_WORD_TITLE}'
    return with_title(with_colour_scale(panel, *WORD_SCALE), title)


def token_weights(records: Sequence[AttentionRecord], query: tuple[int, int], image_size: int,
                  batch_index: int = 0) -> list[tuple[str, torch.Tensor]]:
    """(layer label, (L,) weights) of image pixel `query` (y, x) over the prompt's tokens at every cross-attention
    layer, averaged over the heads; each layer maps the pixel onto its own grid."""
    out = []
    for rec in _of_kind(records, "cross"):
        H, W = rec.size
        w = rec.weights((query[0] * H // image_size, query[1] * W // image_size))[batch_index]  # (h, L)
        out.append((layer_label(rec), w.mean(0)))  # (L,)
    return out


def _bar_chart(title: str, weights: Sequence[float], words: Sequence[str], label_w: int, bar_w: int = 120) -> Image.Image:
    """One layer's horizontal bars: a word, its weight as a bar on a 0-to-1 frame, the number."""
    font, line = chart_font(), LABEL_PX + 5
    img = Image.new("RGB", (label_w + bar_w + 48, line + 2 + line * len(words) + 6), "white")
    draw = ImageDraw.Draw(img)
    draw.text((0, 0), title, fill="black", font=font)
    for i, (word, w) in enumerate(zip(words, weights)):
        y = line + 2 + line * i
        draw.text((label_w - 6 - draw.textlength(word, font=font), y), word, fill="black", font=font)
        draw.rectangle([label_w, y + 2, label_w + bar_w, y + line - 3], outline=(200, 200, 200))  # weight 1
        draw.rectangle([label_w, y + 2, label_w + round(w * bar_w), y + line - 3], fill=(220, 70, 50))
        draw.text((label_w + bar_w + 4, y), f"{w:.2f}", fill="black", font=font)
    return img


def token_weights_panel(image: torch.Tensor, records: Sequence[AttentionRecord], query: tuple[int, int],
                        words: Sequence[str], columns: int = 4, pad: int = 8) -> Image.Image:
    """The image with pixel `query` marked, then a bar chart per cross-attention layer: the pixel's weight on each
    word of the prompt (`words`, the tokenizer's, in order). image (3, S, S) in [0, 1]."""
    S = image.shape[-1]
    font = chart_font()
    label_w = 6 + max(int(ImageDraw.Draw(Image.new("1", (1, 1))).textlength(w, font=font)) for w in words)
    charts = [_bar_chart(label, w[: len(words)].tolist(), words, label_w)
              for label, w in token_weights(records, query, S)]  # weights past the words: padding (a batch's)
    marked = image.float().clone()
    marked[:, query[0], query[1]] = torch.tensor([0.0, 1.0, 1.0])  # cyan, as `overlay` marks a query
    marked = _to_pil(marked, max(1, 96 // S))
    cells = [marked] + charts
    cw, ch = max(c.width for c in cells), max(c.height for c in cells)
    rows = math.ceil(len(cells) / columns)
    panel = Image.new("RGB", (columns * (cw + pad) + pad, rows * (ch + pad) + pad), "white")
    for i, c in enumerate(cells):
        panel.paste(c, (pad + (i % columns) * (cw + pad), pad + (i // columns) * (ch + pad)))
    title = (f"pixel (y={query[0]}, x={query[1]}, cyan): its cross-attention weights over the prompt's words at each "
             "layer (mean of heads; each layer's weights sum to 1)")
    return with_title(panel, title)


def loss_curve(steps: Sequence[int], losses: Sequence[float], title: str = "training loss", size=(640, 360)) -> Image.Image:
    """A loss curve (log y axis, raw points faint, a moving average bold) as a PIL image."""
    W, H = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    left, right, top, bottom = 60, 15, 28, 35
    draw.text((left, 6), title, fill="black", font=chart_font(13))
    if len(steps) < 2:
        draw.text((left, H // 2), "not enough points yet", fill="gray", font=chart_font(12))
        return img
    ys = [math.log10(max(v, 1e-8)) for v in losses]
    window = max(1, len(ys) // 50)
    smooth = [sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
    lo, hi = min(ys), max(ys)
    hi = hi if hi > lo else lo + 1
    x_lo, x_hi = steps[0], max(steps[-1], steps[0] + 1)

    def px(s, y):
        return left + (s - x_lo) / (x_hi - x_lo) * (W - left - right), top + (hi - y) / (hi - lo) * (H - top - bottom)

    draw.rectangle([left, top, W - right, H - bottom], outline="black")
    for frac in (0.0, 0.5, 1.0):
        y = lo + frac * (hi - lo)
        _, yy = px(x_lo, y)
        draw.text((4, yy - 6), f"{10**y:.3g}", fill="black", font=chart_font(10))
        xx, _ = px(x_lo + frac * (x_hi - x_lo), lo)
        draw.text((xx - 12, H - bottom + 4), f"{int(x_lo + frac * (x_hi - x_lo))}", fill="black", font=chart_font(10))
    draw.line([px(s, y) for s, y in zip(steps, ys)], fill=(180, 200, 230), width=1)
    draw.line([px(s, y) for s, y in zip(steps, smooth)], fill=(20, 60, 160), width=2)
    draw.text((W // 2 - 20, H - 16), "step", fill="black", font=chart_font(11))
    return img
