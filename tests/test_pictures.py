"""Pictures of attention: every heatmap panel carries its colour scale."""

from __future__ import annotations

import numpy as np
import torch

from denoiser.pictures import heat_colormap, maps_panel, stages_panel


def _bar_row(panel) -> np.ndarray:
    """The first row of the colour bar: 14+ pixels above the panel's bottom, from x = 4."""
    arr = np.asarray(panel)
    return arr[arr.shape[0] - 4 - 18 - 10 + 2, 4:]


def test_heatmap_panels_end_with_the_colour_scale():
    image = torch.rand(3, 16, 16)
    weights = torch.softmax(torch.randn(2, 8, 8).flatten(1), -1).reshape(2, 8, 8)
    for panel in (maps_panel(image, [("down 8x8 #1", weights)], (3, 4)),
                  stages_panel(image, torch.randn(8, 8), weights[0], (3, 4))):
        row = _bar_row(panel)
        width = min(panel.width - 8, 256)
        want = (heat_colormap(torch.linspace(0, 1, width)[None]).permute(1, 2, 0)[0] * 255).round().numpy()
        assert np.abs(row[:width].astype(float) - want).max() <= 1  # the bar runs through the colormap, low to high


def test_chart_axes_are_scaled_to_their_data():
    """Issue 35 item 13: eleven lines between 0.90 and 0.95 are spread over the chart, not squeezed at its top."""
    from denoiser.evaluate.attention_stats import axis_range

    lo, hi = axis_range([0.90, 0.93, 0.95])
    assert 0.88 < lo < 0.90 and 0.95 < hi < 0.96
    lo, hi = axis_range([2.0, 2.0])  # one value: a small band around it
    assert lo < 2.0 < hi and hi - lo < 0.5


def test_tile_labels_stay_over_their_own_tile():
    """Issue 41 item 14: "down.1.attn.0 (16x16)" ran into its neighbour's "mean of heads"; a long label now wraps,
    so the gap between two tiles stays white from the labels down to the pictures."""
    from denoiser.pictures import tiles_image

    white = torch.ones(3, 16, 16)
    for label in ("down.1.attn.0 (16x16)", "up.0.attn.2 (8x8) averaged over the steps"):
        panel = np.asarray(tiles_image([[(label, white), ("mean of heads", white)]], scale=6))
        tile, pad = 16 * 6, 4
        gap = panel[:, pad + tile : pad + tile + pad]  # between the two tiles, every row
        assert (gap == 255).all(), f"{label!r} runs into the next tile's label"
        assert (panel[:pad + 13, pad : pad + tile] < 128).any()  # the label is drawn (its first line)


def test_attention_panel_draws_the_self_attention_layers_only():
    """A text model's capture holds cross-attention records too (weights over words, not pixels): the pixel panel
    skips them, and one without any self-attention layer says so."""
    import pytest

    from denoiser import UNet
    from denoiser.model.attention_capture import capture_attention
    from denoiser.pictures import attention_panel
    from tests.conftest import TINY

    torch.manual_seed(0)
    unet = UNet(**TINY, cross_attention_dim=12).eval()
    states, mask = torch.randn(1, 3, 12), torch.ones(1, 3, dtype=torch.bool)
    with torch.no_grad(), capture_attention(unet) as records:
        unet(torch.randn(1, 3, 16, 16), 10, encoder_hidden_states=states, encoder_attention_mask=mask)
    assert {r.kind for r in records} == {"self", "cross"}
    image = torch.rand(3, 16, 16)
    own = [r for r in records if r.kind == "self"]
    assert attention_panel(image, records, (3, 4)).tobytes() == attention_panel(image, own, (3, 4)).tobytes()
    with pytest.raises(ValueError, match="no self-attention layer was captured"):
        attention_panel(image, [r for r in records if r.kind == "cross"], (3, 4))


def test_chart_text_never_draws_a_missing_glyph_box():
    """Issue 60 item 6: Pillow's bundled font has no ×, ₀ or →, so the weights header read "red ▯1.5". Every label a
    chart draws is drawn with glyphs the font has: spelled, accents dropped, or "?" for another script."""
    from PIL import Image, ImageDraw

    from denoiser.app.words import word_label, word_weights_chart
    from denoiser.pictures import chart_font

    font = chart_font(12)
    assert not font.has("\ue001") and font.has("a") and not font.has("×")  # the check sees the missing-glyph box
    for label in (word_label("red", 1.5), "t₀ → t₅₀", "café", "日本", "σ 0.1 “quoted” …"):
        drawn = font.drawable(label)
        assert all(font.has(c) for c in drawn), (label, drawn)
    assert font.drawable(word_label("red", 1.5)) == "red x1.5" and font.drawable("café") == "cafe"
    # drawn through the font, a header with "×" equals the spelled one: no box reaches the picture
    chart = word_weights_chart([("mid_cross", torch.full((2, 2), 0.5))], [word_label("red", 1.5), "apple"])
    spelled = word_weights_chart([("mid_cross", torch.full((2, 2), 0.5))], ["red x1.5", "apple"])
    assert chart.tobytes() == spelled.tobytes()
    plain = Image.new("L", (40, 20))
    ImageDraw.Draw(plain).text((2, 2), "×", fill=255, font=font)
    assert plain.getbbox() is not None  # drawn as "x", not as nothing


def test_every_chart_label_is_drawn_at_the_pages_body_text_size():
    """Issue 72: on a phone the word-map and pixel-map labels read 11-12 px beside 14 px body text (the charts keep
    their drawn size and scroll sideways there). Every label the app's charts draw is LABEL_PX tall, the page's body
    text: a capital's height in the drawn picture, measured, matches the same letters drawn at 14 px."""
    from PIL import Image, ImageDraw

    from denoiser.app.words import word_maps_view, word_weights_chart
    from denoiser.pictures import LABEL_PX, chart_font, tiles_image, with_colour_scale, with_title

    assert LABEL_PX >= 14

    def ink_height(img: Image.Image, box: tuple[int, int, int, int]) -> int:
        dark = np.asarray(img.convert("L").crop(box)) < 128
        rows = np.nonzero(dark.any(axis=1))[0]
        return int(rows[-1] - rows[0] + 1) if len(rows) else 0

    reference = Image.new("L", (200, 40), 255)
    ImageDraw.Draw(reference).text((0, 0), "HEAD", fill=0, font=chart_font(LABEL_PX))
    cap = ink_height(reference.convert("RGB"), (0, 0, 200, 40))
    white = torch.ones(3, 32, 32)
    tiles = tiles_image([[("HEAD", white)]], scale=3)
    assert ink_height(tiles, (0, 0, tiles.width, 20)) == cap
    scaled = with_colour_scale(tiles, "LOW", "HIGH")
    assert ink_height(scaled, (0, tiles.height + 10, 60, scaled.height)) == cap
    titled = with_title(tiles, "HEAD")
    assert ink_height(titled, (0, 0, titled.width, titled.height - tiles.height)) == cap
    chart = word_weights_chart([("HEAD", torch.tensor([[0.5, 0.5]]))], ["RED", "APPLE"])
    assert ink_height(chart, (0, 30, 180, chart.height)) == cap  # the layer's label, left of its bars
    view = word_maps_view(white, [("mid.attn (8x8)", torch.full((1, 8, 8), 0.5))])
    assert view.width >= 2 * 96  # the maps at their drawn size: 96 px tiles
