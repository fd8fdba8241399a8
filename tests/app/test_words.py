"""denoiser.app.words: a word's map with all cross-attention layers together, and the two layouts of its panel."""

import re

import torch
from PIL import Image

from denoiser.app.words import all_layers_map, word_maps_view


def _maps(words: int, heads: int = 2) -> list[list[tuple[str, torch.Tensor]]]:
    """Per word: (layer label, (h, H, W)) at three layers of 4x4, 2x2 and 4x4 cells, each pixel's weights a softmax
    over the words, as cross-attention's are."""
    g = torch.Generator().manual_seed(0)
    layers = [("down.1.cross.0 (4x4)", 4), ("mid_cross (2x2)", 2), ("up.0.cross.0 (4x4)", 4)]
    weights = [torch.randn(heads, s, s, words, generator=g).softmax(-1) for _, s in layers]  # (h, H, W, words)
    return [[(label, w[..., j]) for (label, _), w in zip(layers, weights)] for j in range(words)]


def test_all_layers_is_the_mean_of_the_upsampled_layer_maps_and_the_words_share_each_pixel():
    per_word = _maps(words=3)
    got = [all_layers_map(maps, 8) for maps in per_word]
    assert got[0].shape == (8, 8)
    torch.testing.assert_close(sum(got), torch.ones(8, 8))  # every pixel's attention goes to the words, all of it
    mid = per_word[1][1][1].mean(0)  # the 2x2 layer of word 1, mean of heads: each cell covers 4x4 image pixels
    down, up = per_word[1][0][1].mean(0), per_word[1][2][1].mean(0)
    want = (down[1, 2] + mid[0, 1] + up[1, 2]) / 3  # image pixel (3, 5): cell (1, 2) of the 4x4s, (0, 1) of the 2x2
    torch.testing.assert_close(got[1][3, 5], want)


def test_the_panel_is_two_rows_unless_each_head_is_asked_for():
    image = torch.rand(3, 8, 8)
    maps = _maps(words=2, heads=4)[0]
    compact, heads = word_maps_view(image, maps), word_maps_view(image, maps, pixel=(3, 5), heads=True)
    only_down = word_maps_view(image, maps[:2])  # no up path: one row
    assert only_down.height < compact.height < heads.height  # rows: 1 (down and middle), 2 (and the up path), 3 layers
    assert only_down.width == compact.width < heads.width  # image, all layers, 2 layers; image, mean, 4 heads


def test_each_map_is_labelled_with_its_range_and_a_flat_one_says_so(monkeypatch):
    """Issue 51 item 7: each panel was stretched from its own lowest to highest weight with no numbers, so a map of
    0.12-0.16 everywhere looked as focused as a sharp one. Every map's label now gives its range, and a nearly flat
    one says so."""
    from denoiser.app import words

    assert words.map_label("mid_cross", torch.tensor([[0.12, 0.16]])) == "mid_cross 0.12 to 0.16, nearly flat"
    assert words.map_label("mid_cross", torch.tensor([[0.05, 0.80]])) == "mid_cross 0.05 to 0.80"
    seen = []
    monkeypatch.setattr(words, "tiles_image", lambda rows, scale: seen.append(rows) or Image.new("RGB", (64, 64)))
    image, maps = torch.rand(3, 8, 8), _maps(words=2, heads=2)[0]
    words.word_maps_view(image, maps)
    words.word_maps_view(image, maps, heads=True)
    compact = [label for row in seen[0] for label, _ in row if label not in ("image", "up path:")]  # the maps
    each_head = [label for row in seen[1] for label, _ in row[1:]]  # a row: the layer's name over the image, its maps
    assert compact[0].startswith("all layers ") and len(compact) == 1 + len(maps)
    assert all(re.search(r" \d\.\d\d to \d\.\d\d(, nearly flat)?$", label) for label in compact + each_head), (compact, each_head)


def test_every_word_map_is_drawn_on_one_absolute_scale():
    """Issue 60 item 5: the labels gave a map's range, but its colours still stretched that range over the whole
    palette, so a flat map looked focused. Now every map uses one scale (share 0 to 1, its colour bar under the panel):
    a flat map is one colour, and a map at a higher share is brighter than one at a lower share."""
    from denoiser.pictures import WORD_SCALE, word_overlay

    image = torch.zeros(3, 8, 8)
    flat = word_overlay(image, torch.full((4, 4), 0.33))
    assert torch.equal(flat, flat[:, :1, :1].expand_as(flat))  # one colour: nothing looks focused
    low, high = word_overlay(image, torch.full((4, 4), 0.2)), word_overlay(image, torch.full((4, 4), 0.6))
    assert high.sum() > low.sum()  # the absolute level shows (stretched, both were the same colour)
    nearly_flat = word_overlay(image, torch.tensor([[0.31, 0.35], [0.33, 0.34]]))
    assert float((nearly_flat - nearly_flat[:, :1, :1]).abs().max()) < 0.05  # 0.31-0.35 stays nearly one colour
    assert WORD_SCALE == ("share 0", "1: all of the pixel's attention")


def test_a_weights_number_is_black_on_white_whatever_its_bar():
    """Issue 72 finding 8: a number printed white on the dark-red bar (contrast about 4:1) was hard to read; each number
    sits on a white chip of its own, black on white, over a bar of any length."""
    from denoiser.app.words import _BAR, _CELL_W, _LABEL_W, _PAD, _ROW_H, _TOP, chart_font, word_weights_chart

    chart = word_weights_chart([("mid_cross (8x8)", torch.tensor([[0.9, 0.1]]))], ["red", "apple"])
    font = chart_font()
    y0 = _TOP + _PAD + _ROW_H
    for j, text in enumerate(("0.90", "0.10")):
        x0 = _PAD + _LABEL_W + j * _CELL_W
        left, top, right, bottom = font.getbbox(text) if hasattr(font, "getbbox") else (0, 0, 24, 12)
        box = chart.crop((x0 + 2 + left, y0 + 3 + top, x0 + 2 + right, y0 + 3 + bottom))
        colours = {c for _, c in box.getcolors(10_000)}
        assert _BAR not in colours, f"{text} is printed over its bar"
        assert min(sum(c) for c in colours) < 150 and (255, 255, 255) in colours  # dark text on white
