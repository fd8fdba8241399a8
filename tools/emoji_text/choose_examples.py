"""The text model's example prompts (sampling.json's "example_prompts", the app's "try these"), chosen by prompt fidelity.

    HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python -m tools.emoji_text.choose_examples --model weights/emoji --write

Each candidate prompt (below: emoji names, single words, a colour and a thing, a description; every word one the
model's captions held: `WordHashTokenizer.unseen` is empty) is drawn at the folder's own sampling defaults
(sampling.json: UniPC-10, guidance 3), in one batch per round (seed rule: image k of a batch seeded from its seed + k,
as in prompt_fidelity.py). Each image is scored as tools/emoji_text/prompt_fidelity.py scores one: Inception pool
features, cosine, against the 3,812 real 32x32 images of ../shared/data/emoji. An image *hits* when one of its 5
nearest real images is an emoji the prompt asks for: one whose caption texts (name, short name, CLDR keywords: what
the model trained on, tools/emoji_text/emoji_set.py) hold every word of the prompt but "a"/"an"/"the" ("a sad cat": the
crying cat face, whose keywords hold "cat" and "sad"). A broad prompt ("cat") asks for many emoji, so its chance
(5 random real images) is higher: prompts rank by hit@5 minus that chance, then hit@20.

Round 1: every candidate, 4 images (seeds from 0). Round 2: the best 16 of round 1, 12 images more (seeds from 1000),
their hits pooled over all 16 images. The examples: the best 8 of round 2, at most 2 per category of the emoji they ask
for and one per last word (not "red heart" and "blue heart"). Writes choose_examples.json beside this script; --write
also puts the prompts into the model's sampling.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from pathlib import Path

import torch

from denoiser.data.store import cache_root
from denoiser.evaluate.fid import InceptionFeatures, features
from denoiser.folders.model_dir import load
from denoiser.model.text import words
from denoiser.pixels import to_uint8
from denoiser.request import SampleRequest
from denoiser.sampling.plan import resolve, run
from tools.emoji_text.emoji_set import CATALOG, KEYWORDS, fetch_package, load_catalog
from tools.emoji_text.prompt_fidelity import DATA, gallery_features, read_gallery

SEEDS, REFINE, MORE_SEEDS, NUM_EXAMPLES, PER_CATEGORY = 4, 16, 12, 8, 2
ARTICLES = {"a", "an", "the"}

CANDIDATES = {
    "the app's examples before": ["red apple", "grinning face", "red heart", "pizza", "rocket", "cat", "sun", "ghost"],
    "an emoji name": ["banana", "strawberry", "watermelon", "hamburger", "birthday cake", "hot beverage", "dog face",
                      "frog face", "penguin", "octopus", "butterfly", "turtle", "sunflower", "cactus", "evergreen tree",
                      "four leaf clover", "broken heart", "smiling face with sunglasses", "face with tears of joy",
                      "pile of poo", "skull", "soccer ball", "crown", "gem stone", "alarm clock", "umbrella", "snowman",
                      "fire", "rainbow", "crescent moon", "snowflake", "christmas tree", "jack-o-lantern", "japan flag",
                      "trophy", "thumbs up sign", "unicorn face", "police car", "cherries", "carrot"],
    "a colour and a thing": ["blue heart", "green heart", "yellow heart", "green apple", "red car", "blue circle"],
    "a description": ["a sad cat", "crying face", "smiling cat", "hot drink", "a red fruit", "flag of japan"],
}


def emoji_words() -> dict[str, set[str]]:
    """name -> the words of all its caption texts (name, short name, CLDR keywords), as the tokenizer reads them."""
    npm = cache_root() / "npm"
    npm.mkdir(parents=True, exist_ok=True)
    out: dict[str, set[str]] = {}
    for e in load_catalog(fetch_package(CATALOG, npm), fetch_package(KEYWORDS, npm)):
        out.setdefault(e.name, set()).update(w for text in (e.name, e.short_name, *e.keywords) for w in words(text))
    return out


def chance(gallery_size: int, matching: int, k: int = 5) -> float:
    return 1 - math.comb(gallery_size - matching, k) / math.comb(gallery_size, k)


def draw(model, extractor: InceptionFeatures, prompts: list[str], per_prompt: int, seed: int) -> torch.Tensor:
    """(P, per_prompt, D) Inception features of each prompt's images, one batch: prompt i's images are seeded
    seed + per_prompt*i ... (the seed rule, as prompt_fidelity.py), at the folder's sampling defaults."""
    asked = [q for q in prompts for _ in range(per_prompt)]
    images = run(resolve(SampleRequest(num_images=len(asked), prompts=asked, seed=seed, batch_size=64), model)).images
    return features(to_uint8(images), extractor, desc="generated").view(len(prompts), per_prompt, -1)


def rank_key(result: dict, chance_at_5: float) -> tuple[float, float]:
    return result["hit@5"] - chance_at_5, result["hit@20"]


def score(images_feats: torch.Tensor, gallery: torch.Tensor, targets: torch.Tensor) -> dict:
    """hit@5 and hit@20 of one prompt's images: (n, D) features, (G, D) gallery, (G,) bool: a wanted emoji."""
    q, g = torch.nn.functional.normalize(images_feats, dim=1), torch.nn.functional.normalize(gallery, dim=1)
    order = (q @ g.T).topk(20, dim=1).indices  # (n, 20) nearest first
    near = targets[order]  # (n, 20)
    return {"hit@5": near[:, :5].any(1).float().mean().item(), "hit@20": near.any(1).float().mean().item(),
            "per_image@5": near[:, :5].any(1).int().tolist()}


def choose(table: list[dict]) -> list[dict]:
    ranked = sorted((r for r in table if "round_2" in r), key=lambda r: rank_key(r, r["chance@5"]), reverse=True)
    chosen, per_category, last_words = [], Counter(), set()
    for r in ranked:
        if len(chosen) == NUM_EXAMPLES:
            break
        last = words(r["prompt"])[-1]
        if per_category[r["category"]] >= PER_CATEGORY or last in last_words:
            continue
        chosen.append(r)
        per_category[r["category"]] += 1
        last_words.add(last)
    return chosen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=Path("weights/emoji"))
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "choose_examples.json")
    p.add_argument("--write", action="store_true", help="write the chosen prompts into the model's sampling.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    rows = read_gallery(DATA)
    caption_words = emoji_words()
    model = load(args.model)
    candidates = []  # (prompt, kind, (G,) bool: the gallery images it asks for)
    for kind, prompts in CANDIDATES.items():
        for prompt in prompts:
            unseen = model.text.tokenizer.unseen(prompt)
            asked = set(words(prompt)) - ARTICLES
            wanted = torch.tensor([asked <= caption_words.get(r["name"], set()) for r in rows])
            if unseen or not wanted.any():
                print(f"skipped {prompt!r}: unseen words {unseen}" if unseen else f"skipped {prompt!r}: no emoji asked for")
                continue
            candidates.append((prompt, kind, wanted))
    extractor = InceptionFeatures()
    gallery = gallery_features(DATA, rows, extractor)
    t = time.perf_counter()
    first = draw(model, extractor, [c[0] for c in candidates], SEEDS, seed=0)  # (P, SEEDS, D)
    table = []
    for (prompt, kind, wanted), f in zip(candidates, first):
        category = Counter(r["category"] for r, w in zip(rows, wanted.tolist()) if w).most_common(1)[0][0]
        table.append({"prompt": prompt, "kind": kind, "category": category, "emoji_asked": int(wanted.sum()) // 2,
                      "chance@5": chance(len(rows), int(wanted.sum())), "round_1": score(f, gallery, wanted)})
    # round 2: the best REFINE of round 1 drawn MORE_SEEDS times more (seeds from 1000 on: none of round 1's)
    best = sorted(range(len(table)), key=lambda i: rank_key(table[i]["round_1"], table[i]["chance@5"]), reverse=True)[:REFINE]
    more = draw(model, extractor, [table[i]["prompt"] for i in best], MORE_SEEDS, seed=1000)
    for i, f in zip(best, more):
        table[i]["round_2"] = score(f, gallery, candidates[i][2])
    for row in table:
        runs = [row[k] for k in ("round_1", "round_2") if k in row]
        n = sum(len(r["per_image@5"]) for r in runs)
        row["images"] = n
        for key in ("hit@5", "hit@20"):
            row[key] = sum(r[key] * len(r["per_image@5"]) for r in runs) / n
        print(f"{row['prompt']:32s} hit@5 {row['hit@5']:.3f} hit@20 {row['hit@20']:.3f} of {n} images, chance "
              f"{row['chance@5']:.3f} ({row['emoji_asked']} emoji, {row['category']})", flush=True)
    drawing_s = time.perf_counter() - t  # sampling and Inception
    chosen = choose(table)
    sampling = json.loads((args.model / "sampling.json").read_text())
    result = {"model": str(args.model), "seeds": f"round 1: {SEEDS} per prompt from 0; round 2: {MORE_SEEDS} per prompt from 1000",
              "scheduler": "the folder's",
              "guidance_scale": sampling.get("guidance_scale"), "num_inference_steps": sampling.get("num_inference_steps"),
              "gallery": len(rows), "drawing_s": round(drawing_s, 1), "candidates": table, "chosen": [r["prompt"] for r in chosen],
              "total_s": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("chosen:", result["chosen"], f"({result['total_s']} s)")
    if args.write:
        sampling["example_prompts"] = result["chosen"]
        (args.model / "sampling.json").write_text(json.dumps(sampling, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
