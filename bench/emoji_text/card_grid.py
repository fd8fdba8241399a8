"""The model card's grid: 64 named prompts, one image each, labelled (issue 39: "a grid of 64 named prompts").

    python bench/emoji_text/card_grid.py --model weights/emoji --out weights/emoji/samples.png

Prompt k is drawn from a generator seeded k (the seed rule) at the folder's default sampling (its scheduler and
sampling.json). The prompts are emoji names of the set (metadata.csv), 8 per row, roughly by category.
"""

from __future__ import annotations

import argparse

import torch

from denoiser.request import SampleRequest
from denoiser.sampling import resolve, run
from denoiser.visualize import tiles_image

PROMPTS = [
    "grinning face", "face with tears of joy", "smiling face with heart-shaped eyes", "thinking face",
    "sleeping face", "pouting face", "pile of poo", "ghost",
    "thumbs up sign", "waving hand sign", "baby", "clapping hands sign", "flexed biceps", "eyes",
    "extraterrestrial alien", "jack-o-lantern",
    "cat face", "dog face", "frog face", "tiger face", "panda face", "unicorn face", "penguin", "octopus",
    "sunflower", "cactus", "palm tree", "christmas tree", "red apple", "banana", "watermelon", "slice of pizza",
    "hamburger", "birthday cake", "hot beverage", "doughnut", "rocket", "automobile", "airplane", "house building",
    "earth globe europe-africa", "sun with face", "rainbow", "snowflake", "fire", "sparkles", "soccer ball",
    "basketball and hoop",
    "trophy", "balloon", "wrapped present", "video game", "guitar", "electric light bulb", "crystal ball", "key",
    "heavy black heart", "warning sign", "black universal recycling symbol", "hash key", "japan flag",
    "united states flag", "france flag", "brazil flag",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="weights/emoji")
    p.add_argument("--out", required=True)
    p.add_argument("--guidance", type=float, default=None, help="default: the folder's sampling.json")
    args = p.parse_args()
    assert len(PROMPTS) == 64, len(PROMPTS)
    plan = resolve(SampleRequest(num_images=64, prompts=PROMPTS, seed=0, guidance_scale=args.guidance, batch_size=64),
                   args.model)
    images = run(plan, progress=True).images  # (64, 3, 32, 32) in [0, 1]
    rows = [[(PROMPTS[r * 8 + c], images[r * 8 + c]) for c in range(8)] for r in range(8)]
    tiles_image(rows, scale=3).save(args.out)
    print(f"{args.out}: 64 prompts, {plan.describe()}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
