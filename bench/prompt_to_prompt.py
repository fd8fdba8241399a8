"""Prompt-to-prompt colour swaps and prompt weighting on the emoji text model (issue 53): what keeps the picture?

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python -m bench.prompt_to_prompt --out bench/prompt_to_prompt.md --docs docs

About 15 minutes on 2 shared cores; `--seeds 1 --cross 0 0.4 --self 0 0.4 --extra --out /tmp/p2p.md --docs /tmp`
looks quickly.
The model folder's own sampler (UniPC-10) and guidance (CFG 3) throughout, in fp32.

Colour swaps (SWAPS: 8 pairs from 5 source prompts): for every seed and every (cross_replace_steps,
self_replace_steps) of the grid and of --extra (self fractions between the grid's), one call samples a source and
all its edits from image 0's noise (`denoiser.sampling.plan.run` with a `PromptEdit`, edit_type "replace"). The plain target is each target prompt sampled
alone from the same noise (a generator seeded the same): what an edit must beat at keeping the shape. Per 32x32 image:

- foreground: the pixels whose RGB distance (Euclidean, in 0..1 units) from the background colour exceeds
  FG_THRESHOLD; the background colour is the per-channel median of the image's 1-pixel border (the emoji are drawn
  on white or light backgrounds).
- shape kept: IoU of the foreground masks, source against edit; its baseline, source against plain target.
- colour moved: how far the edit's mean foreground colour went from the source's toward the plain target's, pooled
  over every swap and seed: sum (e - s).(p - s) / sum |p - s|^2 (e, s, p mean RGB of edit, source, plain target).
  1 is as far as the plain target went, 0 the source's colour; pooling keeps a pair whose plain target barely
  changed colour from dividing by almost nothing.
- mean abs(edit - plain target): per pixel and channel, how much the edit changed the plain target's picture.
- hue share: the fraction of foreground pixels of the target word's colour: a hue within HUE_WINDOW degrees of the
  word's REFERENCE_HUE, saturation and value at least 0.3.

Rule for the defaults: among the settings whose colour moved is at least MIN_MOVED, the one with the most shape
kept. Both fractions 0 must give the plain target (checked, the largest difference printed).

Weighting (WEIGHTED): "(red:w) apple" for w in WEIGHTS, every w from the same noise per seed: the named colour's hue
share, and the IoU of each mask to w = 1's. Object swaps and a "refine" (BEYOND) at the chosen defaults show where
the method stops. Writes the markdown (--out) and the figures (--docs): prompt-editing.png (source, the swap at the
chosen fractions and with self 0.6, plain target; seed 0, not picked), prompt-editing-sweep.png (one swap over the
grid), prompt-editing-limits.png (BEYOND) and prompt-weighting-<prompt>.png (one strip per prompt, a row per seed).
"""

from __future__ import annotations

import argparse
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont
from torchvision.utils import make_grid

from denoiser.folders.model_dir import load
from denoiser.request import PromptEdit, SampleRequest
from denoiser.sampling.plan import resolve, run

SWAPS = {  # source prompt -> its edits (one batch each: the source row serves them all)
    "red circle": ("green circle", "yellow circle"),
    "green square": ("red square", "blue square"),
    "red apple": ("green apple",),
    "red fish": ("green fish",),
    "red balloon": ("green balloon", "yellow balloon"),
}
FIGURE = (("red circle", "green circle"), ("green square", "red square"), ("red apple", "green apple"),
          ("red balloon", "yellow balloon"))  # the README figure's rows, seed 0
SWEEP_FIGURE = ("red balloon", "yellow balloon")  # the pair drawn over the whole grid, seed 0
WEIGHTED = ("(red:{w}) apple", "(blue:{w}) car", "(green:{w}) heart", "(purple:{w}) circle")
WEIGHTS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
BEYOND = (("replace", "red apple", "red heart"), ("replace", "red circle", "red square"),
          ("replace", "cat face", "dog face"), ("refine", "heart", "red heart"))
REFERENCE_HUE = {"red": 0, "orange": 30, "yellow": 55, "green": 120, "blue": 220, "purple": 285}  # degrees
HUE_WINDOW = 30  # a pixel is of a colour within this many degrees of its reference hue
FG_THRESHOLD = 0.25  # RGB distance from the background colour that makes a pixel foreground
MIN_MOVED = 0.8  # the defaults must move the colour at least this far of the way the plain target does


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


@dataclass
class Model:
    """One loaded text model that every call shares (denoiser.folders.model_dir.load, once)."""

    folder: str

    def __post_init__(self) -> None:
        self.model = load(self.folder)  # the UNet, its text model and defaults, loaded once

    def edit(self, edit_type: str, source: str, targets: tuple[str, ...], seed: int, cross: float,
             self_: float) -> torch.Tensor:
        """(1 + len(targets), 3, H, W): the source, then each edit, all from image 0's noise of `seed`."""
        edit = PromptEdit(edit_type=edit_type, cross_replace_steps=cross, self_replace_steps=self_)
        request = SampleRequest(num_images=1 + len(targets), prompts=[source, *targets], seed=seed, edit=edit)
        return run(resolve(request, self.model)).images

    def plain(self, prompts: list[str], seed: int) -> torch.Tensor:
        """(len(prompts), 3, H, W): each prompt alone from the noise that image 0 of `seed` starts from."""
        request = SampleRequest(num_images=len(prompts), prompts=prompts, seed=seed)
        plan = resolve(request, self.model)
        return run(plan, generator=[torch.Generator().manual_seed(seed) for _ in prompts]).images


# --------------------------------------------------------------------------------------------
# Measures
# --------------------------------------------------------------------------------------------


def foreground(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) -> (B, H, W) bool: farther than FG_THRESHOLD from the median colour of the 1-pixel border."""
    border = torch.cat([images[..., 0, :], images[..., -1, :], images[..., 1:-1, 0], images[..., 1:-1, -1]], -1)
    background = border.median(dim=-1).values  # (B, 3)
    return (images - background[..., None, None]).norm(dim=1) > FG_THRESHOLD


def iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B, H, W) bool masks -> (B,) intersection over union (1 where both are empty)."""
    inter, union = (a & b).sum((-2, -1)).float(), (a | b).sum((-2, -1)).float()
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(union))


def mean_colour(images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, 3): the mean RGB of each image's foreground (of the whole image where it has none)."""
    m = mask[:, None].float()  # (B, 1, H, W)
    count = m.sum((-2, -1))
    fg = (images * m).sum((-2, -1)) / count.clamp(min=1)
    return torch.where(count > 0, fg, images.mean((-2, -1)))


def hue_share(images: torch.Tensor, mask: torch.Tensor, colour: str) -> torch.Tensor:
    """(B,): the fraction of foreground pixels of `colour`: hue within HUE_WINDOW degrees of its REFERENCE_HUE,
    saturation and value at least 0.3 (so grey, black and white pixels are no colour)."""
    value, top = images.max(dim=1)  # (B, H, W)
    delta = value - images.min(dim=1).values
    r, g, b = images.unbind(1)
    d = delta.clamp(min=1e-6)
    hue = torch.where(top == 0, ((g - b) / d) % 6, torch.where(top == 1, (b - r) / d + 2, (r - g) / d + 4)) * 60
    off = (hue - REFERENCE_HUE[colour]).remainder(360)
    near = torch.minimum(off, 360 - off) <= HUE_WINDOW
    hit = near & (delta / value.clamp(min=1e-6) >= 0.3) & (value >= 0.3) & mask
    return hit.sum((-2, -1)).float() / mask.sum((-2, -1)).clamp(min=1).float()


def colour_moved(edit: torch.Tensor, source: torch.Tensor, plain: torch.Tensor) -> float:
    """Pooled over rows of (N, 3) mean colours: sum (e - s).(p - s) / sum |p - s|^2."""
    return float(((edit - source) * (plain - source)).sum() / (plain - source).square().sum())


def first_word(prompt: str) -> str:
    return prompt.split()[0]


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------


@dataclass
class Swaps:
    """Every swap's images for the seeds: rows in the order of `pairs` x seeds (pair-major)."""

    pairs: list[tuple[str, str]]
    seeds: list[int]
    source: torch.Tensor  # (P·S, 3, H, W)
    plain: torch.Tensor  # (P·S, 3, H, W): the target sampled alone from the same noise
    edits: dict[tuple[float, float], torch.Tensor]  # (cross, self) -> (P·S, 3, H, W)

    def row(self, pair: tuple[str, str], seed: int) -> int:
        return self.pairs.index(pair) * len(self.seeds) + self.seeds.index(seed)

    def measure(self, edit: torch.Tensor, rows: list[int] | None = None) -> dict[str, float]:
        """Shape kept, colour moved and the target's hue share of `edit`, over `rows` of the images (None: all)."""
        idx = list(range(len(edit))) if rows is None else rows
        src, plain, edit = self.source[idx], self.plain[idx], edit[idx]
        ms, mp, me = foreground(src), foreground(plain), foreground(edit)
        colours = [first_word(self.pairs[i // len(self.seeds)][1]) for i in idx]
        share = torch.cat([hue_share(edit[k : k + 1], me[k : k + 1], c) for k, c in enumerate(colours)])
        moved = colour_moved(mean_colour(edit, me), mean_colour(src, ms), mean_colour(plain, mp))
        return {"iou": float(iou(ms, me).mean()), "moved": moved, "share": float(share.mean()),
                "diff": float((edit - plain).abs().mean())}

    def pair_rows(self, pair: tuple[str, str]) -> list[int]:
        return [self.row(pair, seed) for seed in self.seeds]


def sweep(model: Model, seeds: list[int], points: list[tuple[float, float]]) -> tuple[Swaps, float]:
    """Every swap at every (cross, self) point and seed; the plain targets; (swaps, max |edit - plain| at (0, 0))."""
    pairs = [(s, t) for s, ts in SWAPS.items() for t in ts]
    edits: dict[tuple[float, float], torch.Tensor] = {}
    source = None
    for n, (c, s) in enumerate(points):
        by_row = {}
        for src, targets in SWAPS.items():
            for seed in seeds:
                images = model.edit("replace", src, targets, seed, c, s)
                by_row[(src, seed)] = images[0]
                for t, image in zip(targets, images[1:]):
                    by_row[(t, src, seed)] = image
        edits[(c, s)] = torch.stack([by_row[(t, src, seed)] for src, t in pairs for seed in seeds])
        sources = torch.stack([by_row[(src, seed)] for src, _ in pairs for seed in seeds])
        if source is not None and not torch.equal(source, sources):
            print(f"note: the source image changed at cross {c}, self {s}: "
                  f"max |diff| {float((source - sources).abs().max()):.2e}")
        source = sources
        print(f"{n + 1}/{len(points)}: cross {c:g}, self {s:g}", flush=True)
    plain_by = {}
    for seed in seeds:
        targets = [t for _, t in pairs]
        for t, image in zip(targets, model.plain(targets, seed)):
            plain_by[(t, seed)] = image
    plain = torch.stack([plain_by[(t, seed)] for _, t in pairs for seed in seeds])
    zero = (0.0, 0.0) if (0.0, 0.0) in edits else None
    sanity = float((edits[zero] - plain).abs().max()) if zero else float("nan")
    return Swaps(pairs, seeds, source, plain, edits), sanity


def choose(swaps: Swaps) -> tuple[tuple[float, float], dict]:
    """The grid point with the most shape kept among those whose colour moved >= MIN_MOVED; all points' measures."""
    table = {key: swaps.measure(images) for key, images in swaps.edits.items()}
    ok = [key for key, m in table.items() if m["moved"] >= MIN_MOVED]
    best = max(ok, key=lambda key: (table[key]["iou"], table[key]["moved"])) if ok else (0.0, 0.0)
    return best, table


# --------------------------------------------------------------------------------------------
# Weighting and the method's limits
# --------------------------------------------------------------------------------------------


def weighting(model: Model, seeds: list[int]) -> dict[str, dict]:
    """Per weighted prompt: its images (seeds x WEIGHTS), the named colour's hue share and the IoU to w = 1, per w."""
    out = {}
    ref = WEIGHTS.index(1.0)
    for template in WEIGHTED:
        prompts = [template.format(w=f"{w:g}") for w in WEIGHTS]
        colour = template[1 : template.index(":")]
        images = torch.stack([model.plain(prompts, seed) for seed in seeds])  # (S, W, 3, H, W)
        masks = foreground(images.flatten(0, 1)).unflatten(0, images.shape[:2])  # (S, W, H, W)
        share = [float(hue_share(images[:, k], masks[:, k], colour).mean()) for k in range(len(WEIGHTS))]
        kept = [float(iou(masks[:, k], masks[:, ref]).mean()) for k in range(len(WEIGHTS))]
        out[template.format(w="w")] = {"images": images, "share": share, "iou": kept, "colour": colour}
    return out


def beyond(model: Model, seeds: list[int], key: tuple[float, float]) -> list[dict]:
    """Object swaps and a refine at the chosen fractions: shape kept, and how close the edit's shape is to the plain
    target's (an object swap that worked would have the target's shape)."""
    rows = []
    for edit_type, src, target in BEYOND:
        images = torch.stack([model.edit(edit_type, src, (target,), seed, *key) for seed in seeds])  # (S, 2, ...)
        plain = torch.cat([model.plain([target], seed) for seed in seeds])
        ms, me, mp = foreground(images[:, 0]), foreground(images[:, 1]), foreground(plain)
        rows.append({"type": edit_type, "source": src, "target": target, "kept": float(iou(ms, me).mean()),
                     "baseline": float(iou(ms, mp).mean()), "to_plain": float(iou(me, mp).mean()),
                     "images": torch.stack([images[:, 0], images[:, 1], plain], 1)})
    return rows


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def labelled(rows: list[tuple[str, list[torch.Tensor]]], headers: list[str], scale: int, label_w: int) -> Image.Image:
    """A grid of (label, images) rows under one header per column, each 32x32 image upscaled `scale` times (nearest)."""
    font = ImageFont.load_default(size=14)
    tiles = torch.stack([image for _, images in rows for image in images])  # (R·C, 3, H, W)
    tiles = torch.nn.functional.interpolate(tiles, scale_factor=scale, mode="nearest")
    pad, top = 4, 24
    block = make_grid(tiles, nrow=len(headers), padding=pad, pad_value=1.0)  # (3, H', W')
    block = Image.fromarray((block.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy())
    canvas = Image.new("RGB", (label_w + block.width, top + block.height), "white")
    canvas.paste(block, (label_w, top))
    draw = ImageDraw.Draw(canvas)
    tile = tiles.shape[-1] + pad
    for c, header in enumerate(headers):
        draw.text((label_w + pad + c * tile, 4), header, fill="black", font=font)
    for r, (label, _) in enumerate(rows):
        draw.text((6, top + pad + r * tile + tile // 2 - 10), label, fill="black", font=font)
    return canvas


def save(image: Image.Image, path: Path) -> None:
    """A PNG of at most 256 colours (the docs' pictures stay a few tens of KB; 32x32 emoji barely change)."""
    image.quantize(256, dither=Image.Dither.NONE).save(path, optimize=True)


def figures(swaps: Swaps, best: tuple[float, float], weighted: dict, limits: list[dict], docs: Path) -> list[Path]:
    """The README figure, the sweep of one swap, the limits and one strip per weighted prompt; the paths written."""
    docs.mkdir(parents=True, exist_ok=True)
    seed = swaps.seeds[0]
    more = (best[0], 0.6)  # the same cross fraction with more of the source's layout, if it was measured
    shown = [best, more] if more in swaps.edits and more != best else [best]
    rows = []
    for pair in FIGURE:
        k = swaps.row(pair, seed)
        rows.append((f"{pair[0]} -> {pair[1]}", [swaps.source[k], *(swaps.edits[p][k] for p in shown), swaps.plain[k]]))
    headers = ["source", *(f"swap ({c:g}, {s:g})" for c, s in shown), "plain target"]
    written = [docs / "prompt-editing.png"]
    save(labelled(rows, headers, 3, 200), written[-1])

    k = swaps.row(SWEEP_FIGURE, seed)
    crosses = sorted({c for c, _ in swaps.edits})
    selves = sorted({s for _, s in swaps.edits if all((c, s) in swaps.edits for c in crosses)})  # the grid's rows
    rows = [(f"self {s:g}", [swaps.source[k]] + [swaps.edits[(c, s)][k] for c in crosses] + [swaps.plain[k]])
            for s in selves]
    headers = ["source"] + [f"cross {c:g}" for c in crosses] + ["target"]
    written.append(docs / "prompt-editing-sweep.png")
    save(labelled(rows, headers, 2, 70), written[-1])

    rows = [(f"{r['type']}: {r['source']} -> {r['target']}", list(r["images"][0])) for r in limits]
    written.append(docs / "prompt-editing-limits.png")
    save(labelled(rows, ["source", "edit", "plain target"], 3, 260), written[-1])

    for name, w in weighted.items():
        images = w["images"]  # (S, W, 3, H, W)
        rows = [(f"seed {s}", list(images[i])) for i, s in enumerate(swaps.seeds)]
        written.append(docs / f"prompt-weighting-{name.replace('(', '').split(':')[0]}-{name.split()[-1]}.png")
        save(labelled(rows, [f"w = {x:g}" for x in WEIGHTS], 2, 60), written[-1])
    return written


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def cpu() -> str:
    """lscpu's model name and whether the CPU has AVX-512, AVX512-BF16 and AMX."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    name = fields.get("Model name", "unknown").strip()
    flags = set(fields.get("Flags", "").split())
    has = {label: any(f in flags for f in names) for label, names in
           (("AVX-512", ["avx512f"]), ("AVX512-BF16", ["avx512_bf16"]), ("AMX", ["amx_tile", "amx_bf16"]))}
    cores = fields.get("CPU(s)", "?").strip()
    return f"{name}, {cores} cores; " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in has.items())


def sweep_table(swaps: Swaps, table: dict, best: tuple[float, float]) -> list[str]:
    base = swaps.measure(swaps.plain)
    src = swaps.measure(swaps.source)
    lines = ["| cross_replace_steps | self_replace_steps | shape kept (IoU source, edit) | colour moved | target hue "
             "share | of the plain target's | mean abs(edit - plain target) |",
             "|---|---|---|---|---|---|---|",
             f"| plain target (baseline) | | {base['iou']:.3f} | 1 | {base['share']:.3f} | 1 | 0 |",
             f"| source (no edit) | | 1 | 0 | {src['share']:.3f} | {src['share'] / base['share']:.2f} "
             f"| {src['diff']:.4f} |"]
    for (c, s), m in sorted(table.items()):
        b = "**" if (c, s) == best else ""
        lines.append(f"| {b}{c:g}{b} | {b}{s:g}{b} | {b}{m['iou']:.3f}{b} | {b}{m['moved']:.2f}{b} | {m['share']:.3f} "
                     f"| {m['share'] / base['share']:.2f} | {m['diff']:.4f} |")
    return lines


def pair_table(swaps: Swaps, best: tuple[float, float]) -> list[str]:
    lines = ["| source -> target | IoU edit | IoU plain target | colour moved | hue share edit / plain / source |",
             "|---|---|---|---|---|"]
    for pair in swaps.pairs:
        rows = swaps.pair_rows(pair)
        e, p = swaps.measure(swaps.edits[best], rows), swaps.measure(swaps.plain, rows)
        s = swaps.measure(swaps.source, rows)
        lines.append(f"| {pair[0]} -> {pair[1]} | {e['iou']:.3f} | {p['iou']:.3f} | {e['moved']:.2f} "
                     f"| {e['share']:.2f} / {p['share']:.2f} / {s['share']:.2f} |")
    return lines


def weight_table(weighted: dict) -> list[str]:
    head = " | ".join(f"w = {w:g}" for w in WEIGHTS)
    lines = [f"| prompt | measure | {head} |", "|---|---|" + "---|" * len(WEIGHTS)]
    for name, w in weighted.items():
        lines.append(f"| `{name}` | {w['colour']} hue share | " + " | ".join(f"{x:.3f}" for x in w["share"]) + " |")
        lines.append("| | IoU to w = 1 | " + " | ".join(f"{x:.3f}" for x in w["iou"]) + " |")
    return lines


def beyond_table(rows: list[dict]) -> list[str]:
    lines = ["| edit_type | source -> target | IoU source, edit | IoU source, plain target | IoU edit, plain target |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['type']} | {r['source']} -> {r['target']} | {r['kept']:.3f} | {r['baseline']:.3f} "
                     f"| {r['to_plain']:.3f} |")
    return lines


def report(swaps: Swaps, sanity: float, table: dict, best: tuple[float, float], weighted: dict,
           limits: list[dict], written: list[Path], seconds: float) -> str:
    n = len(swaps.pairs) * len(swaps.seeds)
    lines = [
        "# Prompt-to-prompt colour swaps and prompt weighting on `weights/emoji` (issue 53)", "",
        "Written by `bench/prompt_to_prompt.py`, whose docstring defines every measure:", "", "```bash",
        "HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python -m bench.prompt_to_prompt --out bench/prompt_to_prompt.md --docs docs",
        "```", "",
        f"CPU: {cpu()}. fp32, `torch.set_num_threads(1)`; the whole run took {seconds:.0f} s on a shared machine (not "
        "a speed). The model folder's sampler and guidance (UniPC-10, CFG 3); seeds "
        f"{', '.join(map(str, swaps.seeds))}; the foreground is every pixel farther than {FG_THRESHOLD} (RGB distance, "
        "0..1 units) from the median colour of the image's 1-pixel border.", "",
        "## Colour swaps: the sweep", "",
        f"{len(swaps.pairs)} swaps x {len(swaps.seeds)} seeds = {n} edits per row. *Shape kept*: mean IoU of the source's "
        "and the edit's foreground masks. *Colour moved*: how far the edit's mean foreground colour went from the "
        "source's toward the plain target's, pooled over the rows (1: as far as the plain target; 0: the source's). "
        "*Target hue share*: the fraction of the edit's foreground in the target word's colour (hue within "
        f"{HUE_WINDOW} degrees of the word's, saturated), and that as a fraction of the plain target's. *mean abs(edit - "
        "plain target)*: how much the edit changed the plain target's picture, per pixel and channel (0..1).", "",
        f"Sanity check: both fractions 0 give the plain target (max |edit - plain target| = {sanity:.1e} over all "
        f"{n} images). Rule: the most shape kept among the settings whose colour moved is at least {MIN_MOVED}. "
        f"Chosen: **cross_replace_steps {best[0]:g}, self_replace_steps {best[1]:g}** (in bold).", "",
        *sweep_table(swaps, table, best), "",
        f"## By swap, at cross {best[0]:g}, self {best[1]:g}", "", *pair_table(swaps, best), "",
        "## Prompt weighting", "",
        "Each weight from the same noise per seed (a prompt with every weight in one batch). *Hue share*: the fraction of "
        "the foreground in the named colour's hue; *IoU to w = 1*: the mask against the unweighted prompt's.", "",
        *weight_table(weighted), "",
        f"## Beyond colour, at cross {best[0]:g}, self {best[1]:g}", "",
        "An object swap that worked would keep the source's place and size and take the target's shape: its IoU to the "
        "source would stay above the plain target's, and its IoU to the plain target would rise. \"refine\" adds a word.",
        "", *beyond_table(limits), "",
        "Figures: " + ", ".join(f"`{p}`" for p in written) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="weights/emoji", help="a text model folder")
    ap.add_argument("--seeds", type=int, default=4, help="seeds 0..N-1")
    ap.add_argument("--cross", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ap.add_argument("--self", dest="selves", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8])
    ap.add_argument("--extra", nargs="*", default=["0.4,0.3", "0.4,0.5"],
                    help="more CROSS,SELF points: the self fractions between the grid's, at one cross fraction")
    ap.add_argument("--out", type=Path, default=Path("bench/prompt_to_prompt.md"))
    ap.add_argument("--docs", type=Path, default=Path("docs"), help="where the PNGs go")
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    model = Model(args.model)
    seeds = list(range(args.seeds))
    with torch.inference_mode():
        points = [(c, s) for c in args.cross for s in args.selves]
        points += [p for p in (tuple(float(v) for v in x.split(",")) for x in args.extra) if p not in points]
        swaps, sanity = sweep(model, seeds, points)
        best, table = choose(swaps)
        weighted = weighting(model, seeds)
        limits = beyond(model, seeds, best)
    written = figures(swaps, best, weighted, limits, args.docs)
    text = report(swaps, sanity, table, best, weighted, limits, written, time.perf_counter() - start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
