"""Reading users' image files: phone photos, bad files, huge claims, and masks mapped onto the image."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from denoiser.image_io import MAX_PIXELS, image_to_model, mask_to_model, open_image
from tests.conftest import ROOT


def _photo(w: int = 2400, h: int = 1800, orientation: int | None = None) -> bytes:
    """A JPEG like a phone's: detailed enough to weigh >= 500 KB at 2400x1800."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def test_a_phone_photo_decodes_small_and_upright():
    data = _photo()
    assert len(data) >= 500_000
    full = open_image(data)
    assert full.size == (2400, 1800) and full.mode == "RGB"
    small = open_image(data, min_side=32)  # JPEG draft: decoded at 1/8 scale, short side still >= 32
    assert small.size == (300, 225)
    sideways = open_image(_photo(400, 200, orientation=6), min_side=32)  # stored landscape, shown portrait
    assert sideways.size[0] < sideways.size[1]


@pytest.mark.parametrize("content, message", [
    (b"this is text, renamed to .png", "not an image denoiser can read"),
    (_photo(256, 256)[:20_000], "damaged or truncated"),
    (b"", "is empty \\(0 bytes\\)"),  # issue 35 item 9: not "not an image"
])
def test_unreadable_files_are_named_without_a_path(tmp_path, content, message):
    path = tmp_path / "secret-folder" / "upload.png"
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        open_image(path)
    assert "secret-folder" not in str(err.value) and "upload.png" not in str(err.value)


def test_an_empty_file_says_so_from_bytes_too():
    with pytest.raises(ValueError, match="the upload is empty"):
        open_image(b"", what="the upload")


@pytest.mark.parametrize("bits, value, expected", [(16, 32768, 128), (16, 65535, 255), (16, 1000, 3)])
def test_16_bit_greyscale_is_scaled_not_clipped(tmp_path, bits, value, expected):
    """Issue 35 item 6: a 16-bit greyscale PNG read as white before (Pillow's own conversion clips at 255)."""
    path = tmp_path / "grey16.png"
    Image.fromarray(np.full((6, 5), value, dtype=np.uint16)).save(path)
    assert Image.open(path).mode.startswith("I")
    img = open_image(path)
    assert img.mode == "RGB" and img.size == (5, 6)
    assert img.getextrema() == ((expected, expected),) * 3


def test_huge_images_are_refused_from_the_header_with_bounded_memory(tmp_path):
    path = tmp_path / "flat.png"
    Image.new("1", (12000, 12000), 1).save(path)  # a few hundred KB claiming 144 megapixels
    assert path.stat().st_size < 1_000_000 and 12000 * 12000 > MAX_PIXELS
    with pytest.raises(ValueError, match="12000x12000 .* at most 50 megapixels"):
        open_image(path)
    bomb = tmp_path / "bomb.png"
    Image.new("1", (16000, 16000), 1).save(bomb)  # past Pillow's own limit: refused by Image.open itself
    with pytest.raises(ValueError, match="far larger than 50 megapixels"):
        open_image(bomb)
    # in a fresh process: the resident-memory peak while refusing it (a full decode: +432 MB as RGB)
    code = (
        "import json, pathlib\nfrom denoiser.image_io import open_image\n"
        "status = lambda k: int(next(l for l in open('/proc/self/status') if l.startswith(k)).split()[1]) // 1024\n"
        "pathlib.Path('/proc/self/clear_refs').write_text('5'); before = status('VmRSS')\n"
        f"try:\n    open_image({str(path)!r})\nexcept ValueError:\n    pass\n"
        "print(json.dumps({'peak_above_mb': status('VmHWM') - before}))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(res.stdout)["peak_above_mb"] < 200


@pytest.mark.parametrize("image_size, mask_size, box", [
    ((256, 256), (300, 100), (100, 20, 200, 60)),  # the case: a mask of another size, off-centre
    ((400, 200), (400, 200), (250, 40, 330, 120)),  # a landscape image: the crop cuts its sides
    ((180, 320), (90, 160), (10, 100, 60, 130)),  # portrait, the mask at half the image's size
])
def test_a_mask_of_any_size_lands_where_it_was_painted(image_size, mask_size, box):
    # the mask's rectangle, stretched onto the image, is a red rectangle in the image: both must land on the
    # same model pixels (up to the one-pixel rim the image's bicubic reduction blurs)
    mw, mh = mask_size
    mask = Image.new("L", mask_size, 0)
    mask.paste(255, box)
    sx, sy = image_size[0] / mw, image_size[1] / mh
    image = Image.new("RGB", image_size, (0, 0, 255))
    image.paste((255, 0, 0), (round(box[0] * sx), round(box[1] * sy), round(box[2] * sx), round(box[3] * sy)))
    m = mask_to_model(mask, image_size, 32)[0, 0]  # (32, 32)
    red = (image_to_model(image, 32)[0, 0] > 0)  # red channel above mid-grey
    assert m.sum() > 0
    differ = (m.bool() ^ red).float()
    rim = torch.nn.functional.max_pool2d(red[None, None].float(), 3, 1, 1)[0, 0] - (
        -torch.nn.functional.max_pool2d(-red[None, None].float(), 3, 1, 1)[0, 0])
    assert (differ * (1 - rim)).sum() == 0  # away from the rectangle's rim they agree exactly
    assert abs(float(m.sum() - red.float().sum())) <= 0.25 * float(red.float().sum()) + 2


def test_pictures_from_tensors_saturate_instead_of_wrapping():
    """to_pil rounds and clamps through denoiser.pixels: a value past 1 is white, not a wrapped dark level."""
    from denoiser.image_io import to_pil, uint8_to_pil

    x = torch.tensor([1.2, 1.0, 0.5, -0.1]).reshape(1, 1, 1, 4).expand(1, 3, 1, 4)  # (B, C, H, W)
    assert list(to_pil(x, nrow=1, padding=0).getdata()) == [(255,) * 3, (255,) * 3, (128,) * 3, (0,) * 3]
    u8 = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    back = torch.from_numpy(np.asarray(uint8_to_pil(u8))).permute(2, 0, 1)  # (H, W, 3) -> (3, H, W)
    assert uint8_to_pil(u8).size == (7, 5) and torch.equal(back, u8)


def test_keep_pixels_decodes_a_large_jpeg_no_larger_than_it_needs(tmp_path):
    """The Photo tab's denoise of a photo over the work budget: one open decodes the JPEG at the smallest scale that
    keeps `keep_pixels` pixels (it read a preview first to learn the size, then decoded again); a smaller image, or
    one that is no JPEG, decodes whole."""
    Image.new("RGB", (1600, 1200), (200, 30, 30)).save(tmp_path / "big.jpg", quality=90)
    img = open_image(tmp_path / "big.jpg", keep_pixels=200_000)
    assert img.size == (800, 600) and img.info["source_size"] == (1600, 1200)  # 1/4 would be 120,000 pixels
    assert open_image(tmp_path / "big.jpg", keep_pixels=2_000_000).size == (1600, 1200)
    Image.new("RGB", (600, 400), (0, 0, 255)).save(tmp_path / "big.png")
    assert open_image(tmp_path / "big.png", keep_pixels=1_000).size == (600, 400)
