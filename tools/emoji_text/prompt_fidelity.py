"""Prompt fidelity of the emoji text model (issue 39): does "red apple" draw a red apple?

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python -m tools.emoji_text.prompt_fidelity --model /tmp/emoji-text-gpu \
        --guidance 1 2 3 --out-dir tools/emoji_text --typed-png docs/emoji-text-typed-prompts.png

For 50 prompts that are emoji names, 4 images each (image k seeded k, the folder's sampler). Each image's
Inception pool features (denoiser.evaluate.fid, TF-FID Inception-v3) are compared by cosine similarity with those of every
real image of ../shared/data/emoji (Noto "google" and Twemoji "twitter", 3,812 images, each decoded to 32x32 as the
data pipeline does: denoiser.data.decode.decode_image, bicubic antialiased); hit@5 = the asked emoji's name is
among the names of the 5 most similar. Beside it:

- chance: 5 gallery images drawn at random without replacement, exactly from the real counts;
- the real-vendor ceiling: one vendor's drawing of the same emoji as the query, the gallery without that image,
  a hit when the other vendor's drawing is among the 5 nearest (both directions, the same 50 emoji).

The 50 emoji: names whose google drawing is in the 500-image validation split of configs/emoji32.yaml (the FID
split, never trained on: tools/emoji_text/holdout_folder.py), drawn with random.Random(0). With --typed-png, 16
prompts a person might type (not emoji names) are drawn 4 times each at --typed-guidance into one labelled grid.
Gallery features are cached under /tmp (keyed by the folder, the size and the file list), a chunk at a time.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import random
import time
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from denoiser.atomic import atomic_path
from denoiser.data.decode import decode_image
from denoiser.evaluate.fid import InceptionFeatures, features
from denoiser.pixels import to_uint8
from denoiser.request import GuidanceRequest, SampleRequest
from denoiser.sampling.plan import resolve, run
from tools.emoji_text.holdout_folder import held_out_files

DATA = Path("../shared/data/emoji")
HELD_OUT_CONFIG = "configs/emoji32.yaml"
NUM_PROMPTS, PER_PROMPT, K, SIZE, PROMPT_SEED = 50, 4, 5, 32, 0

# prompts a person types, by what they ask of the model (none is an emoji name of the set)
TYPED = {
    "a description of one emoji": ["a red fruit", "sad cat", "happy face", "hot drink"],
    "a country or place": ["japan", "france", "pizza from italy", "beach holiday"],
    "a changed attribute": ["blue apple", "green cat", "purple car", "yellow heart with stars"],
    "an idea, no object": ["love", "birthday party", "winter", "good luck"],
}


def read_gallery(data: Path) -> list[dict]:
    with open(data / "metadata.csv", newline="") as f:
        return list(csv.DictReader(f))


def gallery_features(data: Path, rows: list[dict], extractor: InceptionFeatures, chunk: int = 100) -> torch.Tensor:
    """(G, 2048) pool features of every real image at SIZE, cached under /tmp one chunk at a time (a stopped run
    resumes where it stopped)."""
    key = hashlib.sha1(f"{data.resolve()}|{SIZE}|{'|'.join(r['file'] for r in rows)}".encode()).hexdigest()[:16]
    cache = Path(f"/tmp/emoji_gallery_features_{SIZE}px_{key}")
    cache.mkdir(exist_ok=True)
    out = []
    for start in tqdm(range(0, len(rows), chunk), desc="gallery", unit="chunk", dynamic_ncols=True):
        path = cache / f"{start:05d}.safetensors"  # safetensors: a cache is read back without unpickling
        if not path.is_file():
            images = torch.stack([torch.from_numpy(decode_image(data / r["file"], SIZE).copy())
                                  for r in rows[start : start + chunk]])  # (n, 3, S, S) uint8
            with atomic_path(path) as tmp:
                save_file({"features": extractor(images)}, str(tmp))
        out.append(load_file(path)["features"])
    return torch.cat(out)


def pick_prompts(rows: list[dict]) -> list[str]:
    """NUM_PROMPTS emoji names, seeded, among those whose google drawing is held out (each drawn by both vendors)."""
    root, held_out = held_out_files(HELD_OUT_CONFIG)
    if root.resolve() != DATA.resolve():
        raise ValueError(f"{HELD_OUT_CONFIG} reads {root}, not {DATA}: the held-out names would not match the gallery")
    held = set(held_out)
    count: dict[str, int] = {}
    for r in rows:
        count[r["name"]] = count.get(r["name"], 0) + 1
    names = sorted({r["name"] for r in rows if r["file"] in held and r["vendor"] == "google" and count[r["name"]] == 2})
    chosen = set(random.Random(PROMPT_SEED).sample(names, NUM_PROMPTS))
    return [r["name"] for r in rows if r["vendor"] == "google" and r["name"] in chosen]  # in the set's order


def nearest(queries: torch.Tensor, gallery: torch.Tensor, metric: str, exclude: torch.Tensor | None = None) -> torch.Tensor:
    """(Q, D), (G, D) -> (Q, K) gallery indices of the K nearest; exclude (Q,) a gallery index per query, or None."""
    if metric == "cosine":
        q, g = torch.nn.functional.normalize(queries, dim=1), torch.nn.functional.normalize(gallery, dim=1)
        score = q @ g.T  # (Q, G), larger is nearer
    else:
        score = -torch.cdist(queries, gallery)
    if exclude is not None:
        score[torch.arange(len(queries)), exclude] = -math.inf
    return score.topk(K, dim=1).indices


def hits(neighbours: torch.Tensor, asked: list[str], names: list[str]) -> torch.Tensor:
    """(Q, K) indices, the name each query asked for -> (Q,) bool: that name among the K."""
    return torch.tensor([asked[i] in {names[j] for j in row} for i, row in enumerate(neighbours.tolist())])


def chance(names: list[str], prompts: list[str], gallery_size: int, wanted: int | None = None) -> float:
    """P(at least one of K random gallery images, without replacement, has the name), averaged over prompts."""
    def p(m: int) -> float:
        return 1 - math.comb(gallery_size - m, K) / math.comb(gallery_size, K)
    return sum(p(wanted if wanted is not None else names.count(n)) for n in prompts) / len(prompts)


def ceiling(feats: torch.Tensor, rows: list[dict], prompts: list[str], metric: str) -> dict[str, float]:
    """Each vendor's drawing as the query, itself out of the gallery: the other vendor's drawing in the K nearest."""
    names = [r["name"] for r in rows]
    out = {}
    for vendor in ("google", "twitter"):
        index = {r["name"]: i for i, r in enumerate(rows) if r["vendor"] == vendor}
        q = torch.tensor([index[p] for p in prompts])
        out[vendor] = hits(nearest(feats[q], feats, metric, exclude=q), prompts, names).float().mean().item()
    out["both"] = (out["google"] + out["twitter"]) / 2
    return out


def sample(model: str, prompts: list[str], guidance: float, per_prompt: int) -> tuple[torch.Tensor, float]:
    """(len(prompts) * per_prompt, 3, S, S) in [0, 1], prompt i's images k = i*per_prompt + j seeded k; seconds."""
    t0 = time.perf_counter()
    asked = [p for p in prompts for _ in range(per_prompt)]
    plan = resolve(SampleRequest(num_images=len(asked), prompts=asked, seed=0, batch_size=100,
                                 guidance=GuidanceRequest(guidance_scale=guidance)), model)
    return run(plan).images, time.perf_counter() - t0


def sampled_features(model: str, prompts: list[str], guidance: float, extractor: InceptionFeatures):
    """sample()'s images, their features and the sampling seconds, cached under /tmp by the model's weights."""
    weights = Path(model) / "unet" / "diffusion_pytorch_model.safetensors"
    stamp = f"{Path(model).resolve()}|{weights.stat().st_mtime_ns}|{guidance}|{PER_PROMPT}|{'|'.join(prompts)}"
    cache = Path(f"/tmp/emoji_prompt_fidelity_{hashlib.sha1(stamp.encode()).hexdigest()[:16]}.safetensors")
    if cache.is_file():
        saved = load_file(cache)
        return saved["images"], saved["features"], float(saved["seconds"])
    images, seconds = sample(model, prompts, guidance, PER_PROMPT)
    feats = features(to_uint8(images), extractor, desc=f"generated w={guidance:g}")
    with atomic_path(cache) as tmp:
        save_file({"images": images.contiguous(), "features": feats.contiguous(), "seconds": torch.tensor(seconds)}, str(tmp))
    return images, feats, seconds


# --------------------------------------------------------------------------------------------
# Grids
# --------------------------------------------------------------------------------------------


def _tile(image: torch.Tensor, scale: int, border: str | None = None) -> Image.Image:
    img = Image.fromarray(to_uint8(image).permute(1, 2, 0).numpy())  # (C, H, W) -> (H, W, C)
    img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
    if border:
        ImageDraw.Draw(img).rectangle([0, 0, img.width - 1, img.height - 1], outline=border, width=3)
    return img


def grid(rows: list[tuple[str, list[list[tuple[torch.Tensor, str | None]]]]], headers: list[str], title: str,
         scale: int = 2, label_w: int = 250) -> Image.Image:
    """rows: (label, groups of (image, border colour or None)); one header per group; a gap between groups."""
    font, small = ImageFont.load_default(size=14), ImageFont.load_default(size=12)
    tile, gap, pad, top = 32 * scale, 14, 3, 48
    sizes = [len(g) for g in rows[0][1]]
    width = label_w + sum(n * (tile + pad) for n in sizes) + gap * (len(sizes) - 1) + 8
    canvas = Image.new("RGB", (width, top + len(rows) * (tile + pad) + 4), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((6, 4), title, fill="black", font=font)
    x = label_w
    for header, n in zip(headers, sizes):
        draw.text((x, 26), header, fill="black", font=small)
        x += n * (tile + pad) + gap
    for r, (label, groups) in enumerate(rows):
        y = top + r * (tile + pad)
        draw.text((6, y + tile // 2 - 8), label, fill="black", font=font)
        x = label_w
        for group in groups:
            for image, border in group:
                canvas.paste(_tile(image, scale, border), (x, y))
                x += tile + pad
            x += gap
    return canvas


def real_images(rows: list[dict], prompt: str) -> list[torch.Tensor]:
    return [torch.from_numpy(decode_image(DATA / r["file"], SIZE)).float() / 255
            for v in ("google", "twitter") for r in rows if r["name"] == prompt and r["vendor"] == v]


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the text model folder")
    p.add_argument("--guidance", type=float, nargs="+", default=[1.0, 3.0], help="classifier-free guidance scales")
    p.add_argument("--out-dir", type=Path, default=Path("tools/emoji_text"), help="prompt_fidelity.png/.json go here")
    p.add_argument("--typed-png", type=Path, default=None, help="also draw the 16 typed prompts into this PNG")
    p.add_argument("--typed-guidance", type=float, default=3.0)
    args = p.parse_args()
    t_start = time.perf_counter()

    rows = read_gallery(DATA)
    names = [r["name"] for r in rows]
    extractor = InceptionFeatures()
    feats = gallery_features(DATA, rows, extractor)
    prompts = pick_prompts(rows)
    asked = [q for q in prompts for _ in range(PER_PROMPT)]

    results = {"prompts": prompts, "gallery": len(rows), "k": K, "chance": chance(names, prompts, len(rows)),
               "ceiling": {m: ceiling(feats, rows, prompts, m) for m in ("cosine", "l2")},
               "chance_ceiling": chance(names, prompts, len(rows) - 1, wanted=1), "model": {}}
    samples = {}
    for w in args.guidance:
        images, gen, seconds = sampled_features(args.model, prompts, w, extractor)
        per = {m: hits(nearest(gen, feats, m), asked, names) for m in ("cosine", "l2")}
        samples[w] = (images, per["cosine"])
        results["model"][f"{w:g}"] = {
            "hit@5": {m: h.float().mean().item() for m, h in per.items()},
            "prompts_with_a_hit": {m: int(h.view(-1, PER_PROMPT).any(1).sum()) for m, h in per.items()},
            "per_prompt_hits": per["cosine"].view(-1, PER_PROMPT).sum(1).tolist(), "sampling_s": round(seconds, 1)}

    ceil = results["ceiling"]["cosine"]["both"]
    print(f"hit@5 over {NUM_PROMPTS} emoji names x {PER_PROMPT} images, gallery {len(rows)} real 32x32 images, cosine "
          f"(L2) on Inception pool features")
    print(f"{'':28s} {'hit@5':>14s} {'of ceiling':>10s} {'prompts hit':>11s}")
    print(f"{'chance':28s} {results['chance']:8.4f}")
    for w, r in results["model"].items():
        h = r["hit@5"]
        print(f"{'model, guidance ' + w:28s} {h['cosine']:8.3f} ({h['l2']:.3f}) {h['cosine'] / ceil:10.2f} "
              f"{r['prompts_with_a_hit']['cosine']:8d}/{NUM_PROMPTS}")
    for m in ("cosine", "l2"):
        c = results["ceiling"][m]
        print(f"{'ceiling (' + m + ')':28s} {c['both']:8.3f}   google->twitter {c['google']:.2f}, twitter->google "
              f"{c['twitter']:.2f} (chance {results['chance_ceiling']:.4f})")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    ws = list(samples)
    rows_png = []
    for i, prompt in enumerate(prompts):
        groups = [[(samples[w][0][i * PER_PROMPT + j], "#2a2" if samples[w][1][i * PER_PROMPT + j] else "#d33")
                   for j in range(PER_PROMPT)] for w in ws]
        rows_png.append((prompt, groups + [[(x, None) for x in real_images(rows, prompt)]]))
    grid(rows_png, [f"guidance {w:g}" for w in ws] + ["real: google, twitter"],
         f"{args.model}: 50 emoji names, image k seeded k; green border: the asked emoji among the 5 nearest real images"
         ).save(args.out_dir / "prompt_fidelity.png")

    if args.typed_png:
        typed = [q for group in TYPED.values() for q in group]
        images, seconds = sample(args.model, typed, args.typed_guidance, PER_PROMPT)
        results["typed_sampling_s"] = round(seconds, 1)
        rows_png = [(q, [[(images[i * PER_PROMPT + j], None) for j in range(PER_PROMPT)]]) for i, q in enumerate(typed)]
        grid(rows_png, [f"guidance {args.typed_guidance:g}, images seeded 4i..4i+3"],
             "16 typed prompts (not emoji names)", label_w=200).save(args.typed_png)
    results["total_s"] = round(time.perf_counter() - t_start, 1)
    (args.out_dir / "prompt_fidelity.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"total {results['total_s']} s")


if __name__ == "__main__":
    main()
