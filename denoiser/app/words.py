"""Pictures of a text model's cross-attention for the Attention tab: a word's map over the image in every
cross-attention layer, and one pixel's weights over the prompt's words as a table of bars; and how the page names the
words and these pictures (a weighted word with its weight: "red ×1.5").

The maps reuse denoiser.pictures's tiles (overlays on the image): all layers together and each layer's in two
rows, or each head's in a row per layer; the bar table is drawn here in plain PIL, as visualize draws its pictures.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from denoiser.pictures import WORD_SCALE, chart_font, tiles_image, with_colour_scale, word_overlay
from denoiser.sampling.prompt_notes import unread_note, unseen_note

__all__ = ["map_label", "unread_note", "unseen_note", "words_label", "word_maps_view", "all_layers_map", "word_weights_chart", "word_label", "word_choices", "word_maps_label",
           "word_weights_label"]

_BAR = (220, 70, 50)  # the heat map's red: the same colour means "weight" on both pictures
_PAD, _ROW_H, _LABEL_W, _CELL_W = 6, 22, 190, 96
FLAT = 1.5  # a map whose highest weight is under this times its lowest is called nearly flat (map_label)
_TOP = 30  # the page's label sits over the picture's top-left corner: the table and the maps start below it


def words_label(read: Sequence[str], unread: Sequence[str], unseen: Sequence[str] = ()) -> str:
    """The Attention tab's word list's label: the words the model read, a cut prompt and unseen words said so."""
    notes = [note for note in (unread_note(read, unread), unseen_note(unseen)) if note]
    return "the prompt's words" + (f" ({'; '.join(notes)})" if notes else "")


def word_label(word: str, weight: float = 1.0) -> str:
    """A word as the page names it: "red ×1.5" for a weighted word ("(red:1.5) apple"), the word alone at weight 1."""
    return word if weight == 1.0 else f"{word} ×{weight:.3g}"


def word_choices(words: Sequence[str], weights: Sequence[float]) -> list[tuple[str, int]]:
    """The word selector's choices: (label with its weight, the word's index among the prompt's words)."""
    return [(word_label(w, x), j) for j, (w, x) in enumerate(zip(words, weights))]


def word_maps_label(word: str | None = None) -> str:
    """The word map's label, naming the word with its weight ("red ×1.5": its attention as sampled, scaled 1.5)."""
    which = "the chosen word's map" if word is None else f"the map of “{word}”"
    return f"{which}: all cross-attention layers together, then each layer's (mean of heads)"


def word_weights_label(weighted: bool = False) -> str:
    """The pixel's weights' label: a weight other than 1 scales a word's share, so its row no longer sums to 1."""
    sums = "a row sums to 1 plus what the weights add" if weighted else "a row sums to 1"
    return f"the clicked pixel's weights over the words (mean of heads; {sums})"


def all_layers_map(maps: Sequence[tuple[str, torch.Tensor]], size: int) -> torch.Tensor:
    """Where the word lands in the picture, all cross-attention layers together: each layer's head-averaged map
    upsampled to the image's (size, size) grid (nearest: each cell is one pixel of the layer's grid) and averaged
    over the layers. maps: (layer label, (h, H, W)) as Engine.views.word_maps gives them. Each layer's maps of the prompt's
    words sum to one at every pixel, so this map's do too."""
    up = [F.interpolate(w.float().mean(0)[None, None], size=(size, size), mode="nearest")[0, 0] for _, w in maps]  # (S, S)
    return torch.stack(up).mean(0)  # (layers, S, S) -> (S, S)


def word_maps_view(image: torch.Tensor, maps: Sequence[tuple[str, torch.Tensor]], pixel: tuple[int, int] | None = None,
                    heads: bool = False) -> Image.Image:
    """The word's map over the image. maps: (layer label, (h, H, W)) as Engine.views.word_maps gives them; pixel (y, x) in
    image pixels, marked when given.

    heads=False: two rows, the image, all layers together (`all_layers_map`), then each layer's head-averaged map,
    the down path and the middle in the first row, the up path in the second. heads=True: one row per layer, the
    image, the head-averaged map, then each head's.

    Every map is drawn on one absolute colour scale (`denoiser.pictures.word_overlay`: a pixel's share 0 to 1, the
    colour bar under the panel), so a nearly flat map looks flat; each map's label gives its range, and says when it
    is nearly flat (map_label)."""
    S = image.shape[-1]
    tiles = [(map_label(label, w.mean(0)), word_overlay(image, w.mean(0), pixel)) for label, w in maps]  # mean of heads
    if heads:
        rows = []
        for (label, w), (_, mean) in zip(maps, tiles):
            row = [(label, image), (map_label("mean of heads", w.mean(0)), mean)]
            if w.shape[0] > 1:
                row += [(map_label(f"head {i}", w[i]), word_overlay(image, w[i], pixel)) for i in range(w.shape[0])]
            rows.append(row)
    else:
        cut = next((i for i, (label, _) in enumerate(tiles) if label.startswith("up.")), len(tiles))
        together = all_layers_map(maps, S)
        rows = [[("image", image), (map_label("all layers", together), word_overlay(image, together, pixel))]
                + tiles[:cut]]
        if cut < len(tiles):
            rows.append([("up path:", image)] + tiles[cut:])
    panel = with_colour_scale(tiles_image(rows, max(1, 96 // S)), *WORD_SCALE)
    framed = Image.new("RGB", (panel.width, panel.height + _TOP), "white")  # the first row's names below the page's label
    framed.paste(panel, (0, _TOP))
    return framed


def map_label(label: str, heat: torch.Tensor) -> str:
    """A word map's label with the weights its colours span ("mid_cross 0.12 to 0.16"), and "nearly flat" where its
    highest weight is under FLAT times its lowest: the colours then stretch small differences over the whole scale."""
    lo, hi = float(heat.min()), float(heat.max())
    flat = ", nearly flat" if hi < FLAT * lo else ""
    return f"{label} {lo:.2f} to {hi:.2f}{flat}"


def word_weights_chart(rows: Sequence[tuple[str, torch.Tensor]], words: Sequence[str]) -> Image.Image:
    """A table of bars: one row per cross-attention layer, one column per word; each cell is the pixel's weight on
    that word (mean of heads: a row sums to 1) as a bar and a number. rows: (layer label, weights (h, words))."""
    font = chart_font()  # draws every glyph it is given: "red ×1.5" as "red x1.5", never a missing-glyph box
    width = _LABEL_W + _CELL_W * len(words) + 2 * _PAD
    height = _TOP + _ROW_H * (len(rows) + 1) + 2 * _PAD
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    for j, word in enumerate(words):  # the header: the prompt's words
        draw.text((_PAD + _LABEL_W + j * _CELL_W + 2, _TOP + _PAD + 3), _fit(draw, word, _CELL_W - 4, font), fill="black", font=font)
    for i, (label, w) in enumerate(rows):
        y0 = _TOP + _PAD + (i + 1) * _ROW_H
        draw.line([(_PAD, y0), (width - _PAD, y0)], fill=(225, 225, 225))
        draw.text((_PAD, y0 + 3), _fit(draw, label, _LABEL_W - 6, font), fill="black", font=font)
        mean = w.float().mean(0)  # (words,)
        for j, value in enumerate(mean.tolist()):
            x0 = _PAD + _LABEL_W + j * _CELL_W
            bar = round(value * (_CELL_W - 8))
            if bar > 0:
                draw.rectangle([x0, y0 + 4, x0 + bar, y0 + _ROW_H - 4], fill=_BAR)
            number = f"{value:.2f}"  # black on a white chip: white on the red bar was hard to read (about 4:1)
            left, top, right, bottom = draw.textbbox((x0 + 2, y0 + 3), number, font=font)
            draw.rectangle([left - 1, top - 1, right, bottom], fill="white")
            draw.text((x0 + 2, y0 + 3), number, fill="black", font=font)
    return img


def _fit(draw: ImageDraw.ImageDraw, text: str, width: float, font) -> str:
    """`text` cut with an ellipsis to fit `width` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"
