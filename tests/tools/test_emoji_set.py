"""The emoji set builder (tools/emoji_text/emoji_set.py) on tiny fake npm packages served from a file:// registry
in tmp_path: no network."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from denoiser.data.folder import list_folder
from tools.emoji_text import emoji_set as es  # a data-set builder among the tools, not part of the package

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CATALOG_ENTRIES = [
    {"name": "GRINNING FACE", "unified": "1F600", "image": "1f600.png", "short_name": "grinning",
     "category": "Smileys & Emotion", "subcategory": "face-smiling"},
    {"name": "Japan Flag", "unified": "1F1EF-1F1F5", "image": "1f1ef-1f1f5.png", "short_name": "jp",
     "category": "Flags", "subcategory": "country-flag"},
    {"name": "HASH KEY", "unified": "0023-FE0F-20E3", "image": "0023-fe0f-20e3.png", "short_name": "hash",
     "category": "Symbols", "subcategory": "keycap"},
    {"name": "EMOJI MODIFIER FITZPATRICK TYPE-1-2", "unified": "1F3FB", "image": "1f3fb.png",
     "short_name": "skin-tone-2", "category": "Component", "subcategory": "skin-tone"},
]
ANNOTATIONS = [
    {"label": "grinning face", "hexcode": "1F600", "tags": ["face", "grin"]},
    {"label": "flag: Japan", "hexcode": "1F1EF-1F1F5", "tags": ["JP", "flag"]},
    {"label": "keycap: #", "hexcode": "0023-20E3", "tags": ["keycap"]},  # emojibase drops FE0F
]


def _png(img: Image.Image, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return out.getvalue()


def _half_transparent(size: int, colour: tuple[int, int, int]) -> Image.Image:
    """Left half opaque `colour`, right half the same colour at alpha 100: compositing is visible."""
    a = np.zeros((size, size, 4), np.uint8)
    a[..., :3] = colour
    a[:, : size // 2, 3] = 255
    a[:, size // 2 :, 3] = 100
    return Image.fromarray(a, "RGBA")


def _tarball(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _publish(registry: Path, name: str, version: str, files: dict[str, bytes]) -> es.NpmPackage:
    """Put a package on the fake registry and return it pinned to its real sha512."""
    package = es.NpmPackage(name, version, "")
    path = registry / name / "-" / package.tarball
    path.parent.mkdir(parents=True, exist_ok=True)
    _tarball(path, files)
    digest = base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()
    return es.NpmPackage(name, version, f"sha512-{digest}")


@pytest.fixture
def fake_registry(tmp_path, monkeypatch) -> tuple[str, list[es.Vendor]]:
    """A registry with a catalog (google, 64px PNGs), keywords, a 3D vendor (256px WebP, incl. a country flag it
    must not use) and an SVG vendor; the module's pins point at them."""
    registry = tmp_path / "registry"
    google = {f"package/img/google/64/{e['image']}": _png(_half_transparent(64, (200, 30, 30)))
              for e in CATALOG_ENTRIES}
    catalog = _publish(registry, "emoji-datasource-google", "1.0.0",
                       {"package/emoji.json": json.dumps(CATALOG_ENTRIES).encode(), **google})
    keywords = _publish(registry, "emojibase-data", "1.0.0", {"package/en/data.json": json.dumps(ANNOTATIONS).encode()})
    webp = _png(_half_transparent(256, (30, 30, 200)), "WEBP")
    three_d = _publish(registry, "@lobehub/fluent-emoji-3d", "1.0.0", {
        "package/assets/1f600.webp": webp, "package/assets/1f1ef-1f1f5.webp": webp,
        "package/assets/23-fe0f-20e3.webp": b"not an image: the padded spelling below must win",
        "package/assets/0023-fe0f-20e3.webp": webp})
    svg = _publish(registry, "openmoji", "1.0.0", {"package/color/svg/1F600.svg": b"<svg/>",
                                                   "package/black/svg/1F600.svg": b"not this folder"})
    vendors = [es.Vendor("google", catalog, "package/img/google/64", ".png", "Apache-2.0 (test)"),
               es.Vendor("fluent-3d", three_d, "package/assets", ".webp", "MIT (test)", ("country-flag",)),
               es.Vendor("openmoji", svg, "package/color/svg", ".svg", "CC-BY-SA-4.0 (test)")]
    monkeypatch.setattr(es, "CATALOG", catalog)
    monkeypatch.setattr(es, "KEYWORDS", keywords)
    monkeypatch.setattr(es, "VENDORS", tuple(vendors))
    return registry.as_uri(), vendors


def _green(svg: bytes, size: int) -> Image.Image:
    """A stand-in rasteriser: the SVG path is tested without resvg installed."""
    assert svg == b"<svg/>"
    return Image.new("RGBA", (size, size), (0, 255, 0, 255))


def _build(tmp_path, registry: str, **kw) -> es.BuildReport:
    cfg = es.EmojiSetConfig(out=tmp_path / "emoji", vendors=("google", "fluent-3d", "openmoji"),
                            cache_dir=tmp_path / "npm", registry=registry, **kw)
    return es.build_emoji_set(cfg, progress=False, rasterise=_green)


def _rows(out: Path) -> list[dict]:
    with open(out / "metadata.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_codepoint_key_joins_the_spellings_of_packages():
    assert es.codepoint_key("0023-FE0F-20E3") == es.codepoint_key("23-fe0f-20e3") == es.codepoint_key("0023-20E3")
    assert es.codepoint_key("1F1EF-1F1F5") == "1f1ef-1f1f5"
    assert es.codepoint_key("1F600") != es.codepoint_key("1F601")


def test_metadata_rows_name_every_image_with_keywords_and_licence(tmp_path, fake_registry):
    registry, _ = fake_registry
    report = _build(tmp_path, registry)
    rows = _rows(report.out)
    assert list(rows[0]) == list(es.METADATA_COLUMNS)
    assert [r["file"] for r in rows] == [  # catalog order, vendors in turn; no Component; no fluent country flag
        "smileys-emotion/google-1f600.png", "smileys-emotion/fluent-3d-1f600.png", "smileys-emotion/openmoji-1f600.png",
        "flags/google-1f1ef-1f1f5.png", "symbols/google-0023-fe0f-20e3.png", "symbols/fluent-3d-0023-fe0f-20e3.png"]
    first = rows[0]
    assert (first["name"], first["short_name"], first["keywords"]) == ("grinning face", "grinning", "face|grin")
    assert (first["category"], first["subcategory"], first["license"]) == ("Smileys & Emotion", "face-smiling",
                                                                          "Apache-2.0 (test)")
    # the CLDR name leads where it differs from the Unicode name; matched although emojibase drops FE0F
    assert rows[-1]["keywords"] == "keycap: #|keycap"
    assert rows[3]["name"] == "japan flag" and rows[3]["keywords"] == "flag: Japan|JP|flag"
    assert report.per_vendor == {"google": 3, "fluent-3d": 2, "openmoji": 1}
    assert (tmp_path / "npm" / "lobehub-fluent-emoji-3d-1.0.0.tgz").is_file()  # the scope kept in the cache's name
    assert report.missing["fluent-3d"] == ["1f1ef-1f1f5"] and report.missing["openmoji"] == ["1f1ef-1f1f5",
                                                                                             "0023-fe0f-20e3"]
    readme = (report.out / "README.md").read_text()
    assert "| fluent-3d | 2 | 1 |" in readme and "attribution" in readme


def test_tiles_are_rgb_on_white_at_the_tile_size(tmp_path, fake_registry):
    registry, _ = fake_registry
    out = _build(tmp_path, registry).out
    # a 64px source is composited only, exactly: alpha 100 of (200, 30, 30) over white
    google = np.asarray(Image.open(out / "smileys-emotion/google-1f600.png"))
    expected = np.asarray(Image.alpha_composite(Image.new("RGBA", (64, 64), "white"),
                                                _half_transparent(64, (200, 30, 30))).convert("RGB"))
    assert google.shape == (64, 64, 3) and np.array_equal(google, expected)
    # a 256px source is resized: opaque blue on the left, blue-on-white on the right
    three_d = np.asarray(Image.open(out / "smileys-emotion/fluent-3d-1f600.png")).astype(int)
    assert three_d.shape == (64, 64, 3)
    assert np.abs(three_d[32, 8] - [30, 30, 200]).max() <= 2
    assert np.abs(three_d[32, 56] - (np.array([30, 30, 200]) * 100 + 255 * 155) / 255).max() <= 2
    assert np.array_equal(np.asarray(Image.open(out / "smileys-emotion/openmoji-1f600.png"))[0, 0], [0, 255, 0])


def test_the_folder_loader_reads_the_built_set(tmp_path, fake_registry):
    registry, _ = fake_registry
    out = _build(tmp_path, registry).out
    source = list_folder(out)
    assert source.classes == ["flags", "smileys-emotion", "symbols"]
    assert sorted(source.files) == sorted(r["file"] for r in _rows(out))  # no README, no metadata.csv
    assert source.labels[source.files.index("symbols/google-0023-fe0f-20e3.png")] == 2


def test_a_changed_package_is_refused_and_nothing_is_cached(tmp_path, fake_registry, monkeypatch):
    registry, vendors = fake_registry
    pinned = es.NpmPackage(es.CATALOG.name, es.CATALOG.version, "sha512-" + base64.b64encode(b"x" * 64).decode())
    with pytest.raises(ValueError, match="does not match the pinned integrity of emoji-datasource-google@1.0.0"):
        es.fetch_package(pinned, tmp_path / "npm", registry, progress=False)
    assert not any((tmp_path / "npm").iterdir())


def test_a_tampered_cached_tarball_is_refused(tmp_path, fake_registry):
    registry, _ = fake_registry
    path = es.fetch_package(es.KEYWORDS, tmp_path / "npm", registry, progress=False)
    assert es.fetch_package(es.KEYWORDS, tmp_path / "npm", registry, progress=False) == path  # reused, verified
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="delete the file to download it again"):
        es.fetch_package(es.KEYWORDS, tmp_path / "npm", registry, progress=False)


def test_an_existing_set_is_kept_unless_overwrite(tmp_path, fake_registry):
    registry, _ = fake_registry
    (tmp_path / "emoji").mkdir()
    (tmp_path / "emoji" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="--overwrite"):
        _build(tmp_path, registry)
    assert (tmp_path / "emoji" / "mine.txt").exists()
    _build(tmp_path, registry, overwrite=True)
    assert not (tmp_path / "emoji" / "mine.txt").exists() and (tmp_path / "emoji" / "metadata.csv").exists()


def test_the_cli_names_an_unknown_vendor(tmp_path, fake_registry):
    registry, _ = fake_registry
    with pytest.raises(SystemExit, match="unknown or no vendors \\['apple'\\]; choose among google"):
        es.main(["--out", str(tmp_path / "x"), "--vendors", "google,apple", "--registry", registry])


def test_resvg_rasterises_an_svg_to_the_asked_size():
    pytest.importorskip("resvg_py", reason="resvg-py (the SVG rasteriser, an optional extra) is not installed")
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><rect x="0" y="0" width="5" height="10" ' \
          b'fill="#ff0000"/></svg>'
    img = es.render_svg(svg, 32)
    assert img.size == (32, 32) and img.mode == "RGBA"
    assert img.getpixel((4, 16)) == (255, 0, 0, 255) and img.getpixel((28, 16))[3] == 0


def test_a_missing_rasteriser_is_named_before_any_download(tmp_path, fake_registry, monkeypatch):
    registry, _ = fake_registry
    monkeypatch.setitem(sys.modules, "resvg_py", None)  # as if resvg-py were not installed
    cfg = es.EmojiSetConfig(out=tmp_path / "emoji", vendors=("google", "openmoji"), cache_dir=tmp_path / "npm",
                            registry=registry)
    with pytest.raises(ImportError, match="pip install resvg-py"):
        es.build_emoji_set(cfg, progress=False)
    assert not (tmp_path / "npm").exists()
