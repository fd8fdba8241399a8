"""The emoji image set, built from pinned npm packages: every named emoji of Unicode's list (the skin-tone
"Component" swatches left out) as drawn by up to five vendors, 64x64 RGB on white, in ImageFolder layout.

    python -m tools.emoji_text.emoji_set --out DIR        # default DIR: $DENOISER_CACHE/datasets/emoji

- Names, short names, categories and subcategories: `emoji.json` of iamcal's emoji-datasource (the catalog).
- Keywords: the CLDR annotations as packaged by `emojibase-data` (`en/data.json`): the CLDR name (`label`) where it
  differs from the Unicode name, then the CLDR keywords (`tags`), joined with "|".
- Drawings: Noto and Twemoji as 64x64 PNGs (emoji-datasource-google/-twitter, composited onto white exactly
  as the shared set was), Fluent Emoji flat (SVG) and 3D (256x256 WebP) from LobeHub's packaging of
  microsoft/fluentui-emoji, OpenMoji (SVG). SVGs are rasterised with resvg (`pip install resvg-py`).

Each tarball is checked against the registry's sha512 integrity pinned below before anything is read from
it, so a rebuild gives the same files and a republished package is refused. Tarballs are kept in
`$DENOISER_CACHE/npm`; nothing is written into the repository. docs/emoji_set.md has the counts and licences.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import tarfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from denoiser.atomic import atomic_path
from denoiser.data.store import cache_root
from denoiser.image_io import fit_to_size, flatten_to_rgb

__all__ = [
    "NpmPackage", "Vendor", "Emoji", "EmojiSetConfig", "BuildReport", "CATALOG", "KEYWORDS", "VENDORS",
    "fetch_package", "read_members", "load_catalog", "build_emoji_set", "codepoint_key", "render_svg",
]

REGISTRY = "https://registry.npmjs.org"
METADATA_COLUMNS = ("file", "name", "short_name", "keywords", "category", "subcategory", "vendor", "license")
KEYWORD_SEPARATOR = "|"
SVG_SCALE = 4  # SVGs are rasterised at 4x the tile size, then resized like the 256px 3D WebPs


@dataclass(frozen=True)
class NpmPackage:
    name: str  # as on the registry, scope included
    version: str
    integrity: str  # the registry's dist.integrity: "sha512-" + base64 of the tarball's SHA-512

    @property
    def tarball(self) -> str:
        return f"{self.name.split('/')[-1]}-{self.version}.tgz"

    @property
    def cache_name(self) -> str:  # as `npm pack` names it: "@lobehub/x" -> "lobehub-x-1.0.0.tgz"
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"

    def url(self, registry: str) -> str:
        return f"{registry.rstrip('/')}/{self.name}/-/{self.tarball}"


@dataclass(frozen=True)
class Vendor:
    name: str  # the `vendor` column and the file-name prefix: <vendor>-<codepoints>.png
    package: NpmPackage
    folder: str  # where its images lie inside the tarball
    suffix: str  # ".png", ".webp" or ".svg"
    license: str  # the `license` column
    skip_subcategories: tuple[str, ...] = ()  # subcategories whose images in the package are not the vendor's own


CATALOG = NpmPackage("emoji-datasource-google", "16.0.0",
                     "sha512-ZRexfzs7MVoLnmzZmNsO4TKhnAJp5D++Vm6PpUpH/jEQQlemp3l88CjZ+DoZ2faM9R4QxZkOPJCoT8DlPhfQ3A==")
KEYWORDS = NpmPackage("emojibase-data", "16.0.3",
                      "sha512-MopInVCDZeXvqBMPJxnvYUyKw9ImJZqIDr2sABo6acVSPev5IDYX+mf+0tsu96JJyc3INNvgIf06Eso7bdTX2Q==")
_FLUENT = "MIT (Fluent Emoji, Microsoft)"
_LOBEHUB_FLAGS = ("country-flag", "subdivision-flag")  # added by LobeHub; microsoft/fluentui-emoji has none
VENDORS: tuple[Vendor, ...] = (
    Vendor("google", CATALOG, "package/img/google/64", ".png", "Apache-2.0 (Noto Emoji, Google)"),
    Vendor("twitter", NpmPackage(
        "emoji-datasource-twitter", "16.0.0",
        "sha512-7F+uCuHH+7Qnrc15P5tnbvKkg9E6tlzi4MnT2uW1RlN4pLYTza6cP/dstIfSDMtpjFLWuZewWg8jBbuL2eyELQ=="),
        "package/img/twitter/64", ".png", "CC-BY-4.0 (Twemoji, Twitter/X and contributors)"),
    Vendor("fluent-flat", NpmPackage(
        "@lobehub/fluent-emoji-flat", "1.1.0",
        "sha512-lPYCg8+N56MIj+iOgeBeH6AF0tneXxJCvgi41rOTjAWpA5rU2WUcmU1fiIXouEe8GrSTarWCYLY2ML+rdLRHsg=="),
        "package/assets", ".svg", _FLUENT, _LOBEHUB_FLAGS),
    Vendor("fluent-3d", NpmPackage(
        "@lobehub/fluent-emoji-3d", "1.1.0",
        "sha512-Wlq2lVStTnr8BDpIJ0pEnTKO4LuDxxqTEhTvRtD1DLRF0me7ogeRQjKoehDHXuVJ2Qaecgl5wRBv60lUAG3h7g=="),
        "package/assets", ".webp", _FLUENT, _LOBEHUB_FLAGS),
    Vendor("openmoji", NpmPackage(
        "openmoji", "17.0.0",
        "sha512-EBnYrNGdcdw+OSXmENeNE1yBNRu6tOraTmoOyUbJkTmvT/+XETp8RZLSJFzD3lrPc5N9CzsyPnRTk0Vp4UaI9w=="),
        "package/color/svg", ".svg", "CC-BY-SA-4.0 (OpenMoji, the open-source emoji and icon project)"),
)


@dataclass
class EmojiSetConfig:
    out: Path | None = None  # the set's folder; None: $DENOISER_CACHE/datasets/emoji
    vendors: tuple[str, ...] = tuple(v.name for v in VENDORS)  # which of VENDORS to draw, in this order
    size: int = 64  # tile side in pixels
    cache_dir: Path | None = None  # npm tarballs; None: $DENOISER_CACHE/npm
    registry: str = REGISTRY  # where tarballs are fetched from (their sha512 is checked whatever the host)
    overwrite: bool = False  # replace an existing set at `out`


@dataclass(frozen=True)
class Emoji:
    image: str  # codepoints as in emoji-datasource's file names, e.g. "1f600" or "0023-fe0f-20e3"
    name: str
    short_name: str
    category: str
    subcategory: str
    keywords: tuple[str, ...]

    @property
    def folder(self) -> str:  # "Smileys & Emotion" -> "smileys-emotion"
        return "-".join(self.category.lower().replace("&", " ").split())


@dataclass
class BuildReport:
    out: Path
    per_vendor: Counter = field(default_factory=Counter)
    per_category: dict[str, Counter] = field(default_factory=dict)  # folder -> vendor -> images
    missing: dict[str, list[str]] = field(default_factory=dict)  # vendor -> codepoints it does not draw
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.per_vendor.values())


def codepoint_key(codepoints: str) -> str:
    """One key for the spellings packages use: case, leading zeros and the FE0F presentation selector dropped
    ("0023-FE0F-20E3", "23-fe0f-20e3" and "0023-20E3" all become "23-20e3")."""
    parts = [p.lower().lstrip("0") or "0" for p in codepoints.replace("_", "-").split("-")]
    return "-".join(p for p in parts if p != "fe0f")


def _integrity(path: Path) -> str:
    digest = hashlib.sha512()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


def fetch_package(package: NpmPackage, cache_dir: Path, registry: str = REGISTRY, progress: bool = True) -> Path:
    """The package's tarball in `cache_dir`, downloaded if it is not there, always checked against its pinned
    sha512. A mismatch is refused: a changed package would silently change the set."""
    path = cache_dir / package.cache_name
    if not path.is_file():
        url = package.url(registry)
        with atomic_path(path) as tmp, urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            with _progress(progress, total=total, unit="B", unit_scale=True, desc=package.cache_name) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    f.write(block)
                    bar.update(len(block))
            f.flush()
            got = _integrity(tmp)
            if got != package.integrity:
                raise ValueError(f"{url} does not match the pinned integrity of {package.name}@{package.version} "
                                 f"(expected {package.integrity}, got {got}); the package was changed or the "
                                 "download is corrupt. Nothing was kept; pin the new version on purpose or retry")
        return path
    got = _integrity(path)
    if got != package.integrity:
        raise ValueError(f"cached {path} does not match the pinned integrity of {package.name}@{package.version} "
                         f"(expected {package.integrity}, got {got}); delete the file to download it again")
    return path


def read_members(tarball: Path, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The regular files of a .tgz whose path passes `wanted`, read in one streaming pass."""
    found = {}
    with tarfile.open(tarball, "r|gz") as tar:
        for member in tar:
            if member.isfile() and wanted(member.name):
                found[member.name] = tar.extractfile(member).read()
    return found


def load_catalog(catalog_tgz: Path, keywords_tgz: Path) -> list[Emoji]:
    """The named emoji of emoji-datasource's `emoji.json`, in its order, skin-tone swatches ("Component") out,
    each with its CLDR keywords from emojibase-data."""
    entries = json.loads(read_members(catalog_tgz, lambda n: n == "package/emoji.json")["package/emoji.json"])
    annotated = json.loads(read_members(keywords_tgz, lambda n: n == "package/en/data.json")["package/en/data.json"])
    cldr = {}  # codepoint_key -> (CLDR name, CLDR keywords)
    for entry in annotated:
        for e in [entry, *entry.get("skins", [])]:
            cldr[codepoint_key(e["hexcode"])] = (e.get("label", ""), tuple(e.get("tags", ())))
    emoji = []
    for e in entries:
        if not e.get("name") or e["category"] == "Component":
            continue
        label, tags = cldr.get(codepoint_key(e["unified"]), ("", ()))
        # the CLDR name leads where it differs from the Unicode name: "red heart" for "heavy black heart"
        keywords = ((label,) if label and label.lower() != e["name"].lower() else ()) + tags
        emoji.append(Emoji(e["image"].removesuffix(".png"), e["name"].lower(), e["short_name"], e["category"],
                           e["subcategory"], keywords))
    return emoji


def _vendor_images(members: dict[str, bytes], vendor: Vendor) -> dict[str, bytes]:
    """codepoint_key -> image bytes. Where two files share a key (LobeHub ships "39-fe0f-20e3" beside
    "0039-fe0f-20e3"), the first in sorted order wins: the zero-padded spelling, as emoji-datasource's."""
    images: dict[str, bytes] = {}
    for path in sorted(members):
        images.setdefault(codepoint_key(Path(path).name.removesuffix(vendor.suffix)), members[path])
    return images


def _resvg():
    try:
        import resvg_py
    except ImportError as e:
        raise ImportError("the Fluent flat and OpenMoji drawings are SVG: install the rasteriser with "
                          "`pip install resvg-py==0.5.0`, or build without them (--vendors google,twitter,fluent-3d)"
                          ) from e
    return resvg_py


def render_svg(svg: bytes, size: int) -> Image.Image:
    """An SVG rasterised by resvg to a size x size RGBA image (an optional extra: `pip install resvg-py`)."""
    png = _resvg().svg_to_bytes(svg_string=svg.decode("utf-8"), width=size, height=size)
    return Image.open(io.BytesIO(bytes(png))).convert("RGBA")


def to_tile(data: bytes, suffix: str, size: int, rasterise: Callable[[bytes, int], Image.Image] = render_svg
            ) -> Image.Image:
    """One vendor file -> size x size RGB on white. A file already at `size` is only composited (this is how
    the 64px Noto and Twemoji PNGs reproduce the shared set); larger ones are flattened, then resized by the
    package's one rule (bicubic, antialiased; a non-square one is centre-cropped)."""
    if suffix == ".svg":
        img = rasterise(data, size * SVG_SCALE)
    else:
        img = Image.open(io.BytesIO(data))
        img.load()
    rgb = flatten_to_rgb(img)
    return rgb if rgb.size == (size, size) else fit_to_size(size)(rgb)


def build_emoji_set(cfg: EmojiSetConfig, progress: bool = True,
                    rasterise: Callable[[bytes, int], Image.Image] = render_svg) -> BuildReport:
    """Download (or reuse) the pinned packages, draw every emoji of the catalog by each chosen vendor that draws
    it, and write the ImageFolder, metadata.csv and README.md to `cfg.out` (published whole at the end)."""
    start = time.perf_counter()
    vendors = _chosen(cfg.vendors)
    if cfg.size < 1:
        raise ValueError(f"size is the tile side in pixels and must be positive, got {cfg.size}; the set's is 64")
    if rasterise is render_svg and any(v.suffix == ".svg" for v in vendors):
        _resvg()  # before the downloads, not after them
    out = Path(cfg.out or cache_root() / "datasets" / "emoji").expanduser()
    if out.exists() and any(out.iterdir()) and not cfg.overwrite:
        raise FileExistsError(f"{out} already holds files; pass --overwrite to replace it, or choose another --out")
    cache = Path(cfg.cache_dir or cache_root() / "npm").expanduser()
    tarballs = {p: fetch_package(p, cache, cfg.registry, progress)
                for p in dict.fromkeys([CATALOG, KEYWORDS, *(v.package for v in vendors)])}
    catalog = load_catalog(tarballs[CATALOG], tarballs[KEYWORDS])
    drawings = {}
    for v in vendors:
        members = read_members(tarballs[v.package], lambda n, v=v: n.startswith(v.folder + "/") and n.endswith(v.suffix))
        drawings[v.name] = _vendor_images(members, v)
    report = BuildReport(out)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        rows = _write_tiles(tmp, catalog, vendors, drawings, cfg.size, report, progress, rasterise)
        _write_metadata(tmp / "metadata.csv", rows)
        report.seconds = time.perf_counter() - start
        (tmp / "README.md").write_text(readme(report, vendors, len(catalog), cfg.size))
    return report


def _chosen(names: Iterable[str]) -> list[Vendor]:
    known = {v.name: v for v in VENDORS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown or no vendors {unknown}; choose among {', '.join(known)}")
    return [known[n] for n in names]


def _write_tiles(root: Path, catalog: list[Emoji], vendors: list[Vendor], drawings: dict[str, dict[str, bytes]],
                 size: int, report: BuildReport, progress: bool, rasterise: Callable) -> list[dict]:
    rows = []
    for emoji in _progress(progress, iterable=catalog, desc="emoji", unit="emoji"):
        key = codepoint_key(emoji.image)
        (root / emoji.folder).mkdir(exist_ok=True)
        for v in vendors:
            data = drawings[v.name].get(key)
            if data is None or emoji.subcategory in v.skip_subcategories:
                report.missing.setdefault(v.name, []).append(emoji.image)
                continue
            rel = f"{emoji.folder}/{v.name}-{emoji.image}.png"
            to_tile(data, v.suffix, size, rasterise).save(root / rel, optimize=True)  # as the shared set: same bytes
            rows.append({"file": rel, "name": emoji.name, "short_name": emoji.short_name,
                         "keywords": KEYWORD_SEPARATOR.join(emoji.keywords), "category": emoji.category,
                         "subcategory": emoji.subcategory, "vendor": v.name, "license": v.license})
            report.per_vendor[v.name] += 1
            report.per_category.setdefault(emoji.folder, Counter())[v.name] += 1
    return rows


def _write_metadata(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=METADATA_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def readme(report: BuildReport, vendors: list[Vendor], num_emoji: int, size: int) -> str:
    """The set's README: what it is, counts per vendor and per category, sources, licences and attribution."""
    names = [v.name for v in vendors]
    lines = [f"# Emoji, {size}x{size}: {num_emoji} named emoji by {len(vendors)} vendors", "",
             f"{report.total:,} images, {size}x{size} PNG composited onto white (RGB), ImageFolder layout by the 9 "
             "Unicode emoji categories (the skin-tone \"Component\" swatches left out). Built by "
             "`python -m tools.emoji_text.emoji_set` from the pinned npm packages below.", "",
             "| vendor | images | emoji it does not draw |", "|---|---|---|"]
    lines += [f"| {n} | {report.per_vendor[n]} | {len(report.missing.get(n, []))} |" for n in names]
    lines += ["", "| folder | " + " | ".join(names) + " | all |", "|---|" + "---|" * (len(names) + 1)]
    for folder, counts in sorted(report.per_category.items()):
        lines.append(f"| {folder} | " + " | ".join(str(counts[n]) for n in names) + f" | {sum(counts.values())} |")
    lines += ["", "`metadata.csv` has one row per image: " + ", ".join(f"`{c}`" for c in METADATA_COLUMNS) +
              f". `keywords` are the CLDR annotations (emojibase-data): the CLDR name where it differs from `name` "
              f"(\"red heart\" for \"heavy black heart\"), then the CLDR keywords, joined with \"{KEYWORD_SEPARATOR}\". "
              "File names are `<vendor>-<codepoints>.png`.", "", "## Sources and licences (attribution required)", ""]
    lines += [f"- `{v.name}-*.png`: {v.license}; npm `{v.package.name}@{v.package.version}` "
              f"(`{v.package.integrity}`)." for v in vendors]
    lines += [f"- Names and categories: npm `{CATALOG.name}@{CATALOG.version}` (iamcal/emoji-data, MIT); keywords: "
              f"npm `{KEYWORDS.name}@{KEYWORDS.version}` (MIT; CLDR annotations, Unicode License v3).", ""]
    lines += ["Credit, as the licences ask:", ""]
    lines += ["- " + _ATTRIBUTION[v] for v in dict.fromkeys(v.name.split("-")[0] for v in vendors)]
    lines += ["", "A model trained on these images, or a grid of its samples, should carry this attribution in its "
              "model card (docs/emoji_set.md says what to write).", ""]
    return "\n".join(lines)


_ATTRIBUTION = {
    "google": "Noto Emoji: Copyright Google Inc., Apache License 2.0.",
    "twitter": "Twemoji: Copyright Twitter/X and other contributors, CC-BY 4.0 "
               "(https://creativecommons.org/licenses/by/4.0/).",
    "fluent": "Fluent Emoji: Copyright (c) Microsoft Corporation, MIT License (github.com/microsoft/fluentui-emoji), "
              "packaged by LobeHub (@lobehub/fluent-emoji-flat, @lobehub/fluent-emoji-3d, MIT). Country and "
              "subdivision flags are left out: Microsoft's set has none and LobeHub's do not say where they come from.",
    "openmoji": "OpenMoji: all emojis designed by OpenMoji, the open-source emoji and icon project, CC BY-SA 4.0 "
                "(https://creativecommons.org/licenses/by-sa/4.0/). The resized images are adaptations and are "
                "shared under the same licence.",
}


def _progress(enabled: bool, **kwargs):
    from tqdm.auto import tqdm

    return tqdm(disable=not enabled, **kwargs)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.emoji_text.emoji_set", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the set's folder (default: $DENOISER_CACHE/datasets/emoji)")
    parser.add_argument("--vendors", default=",".join(v.name for v in VENDORS),
                        help="comma-separated, among " + ", ".join(v.name for v in VENDORS))
    parser.add_argument("--size", type=int, default=EmojiSetConfig.size, help="tile side in pixels")
    parser.add_argument("--cache-dir", type=Path, help="npm tarballs (default: $DENOISER_CACHE/npm)")
    parser.add_argument("--registry", default=os.environ.get("NPM_CONFIG_REGISTRY", REGISTRY))
    parser.add_argument("--overwrite", action="store_true", help="replace an existing set at --out")
    args = parser.parse_args(argv)
    cfg = EmojiSetConfig(args.out, tuple(n.strip() for n in args.vendors.split(",") if n.strip()), args.size,
                         args.cache_dir, args.registry, args.overwrite)
    try:
        report = build_emoji_set(cfg)
    except (ValueError, FileExistsError, ImportError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"{report.total} images in {report.out} ({report.seconds:.0f} s): "
          + ", ".join(f"{n} {c}" for n, c in report.per_vendor.items()))


if __name__ == "__main__":
    main()
