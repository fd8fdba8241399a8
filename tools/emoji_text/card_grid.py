"""The model card's grid: 64 named prompts, one image each, labelled (issue 39: "a grid of 64 named prompts").

    python -m tools.emoji_text.card_grid --model weights/emoji --out weights/emoji/samples.png \
        --readme-out docs/readme-opening.png

Prompt k is drawn from a generator seeded k (the seed rule) at the folder's default sampling (its scheduler and
sampling.json). The prompts are emoji names of the set (metadata.csv), 8 per row, roughly by category.
--readme-out: the README's opening picture: weights/cifar10/samples.png beside the same images of the 32 shortest
of these names (in grid order, so each label fits its tile), drawn 2x.
"""

from __future__ import annotations

import argparse

import torch
from PIL import Image

from denoiser.pictures import tiles_image, with_title
from denoiser.request import GuidanceRequest, SampleRequest
from denoiser.sampling.plan import resolve, run

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
    p.add_argument("--readme-out", default=None, help="also draw the README's opening picture here")
    args = p.parse_args()
    assert len(PROMPTS) == 64, len(PROMPTS)
    plan = resolve(SampleRequest(num_images=64, prompts=PROMPTS, seed=0, batch_size=64,
                                 guidance=GuidanceRequest(guidance_scale=args.guidance)),
                   args.model)
    images = run(plan, progress=True).images  # (64, 3, 32, 32) in [0, 1]
    rows = [[(PROMPTS[r * 8 + c], images[r * 8 + c]) for c in range(8)] for r in range(8)]
    tiles_image(rows, scale=3).save(args.out)
    print(f"{args.out}: 64 prompts, {plan.describe()}")
    if args.readme_out:
        readme_picture(images, plan.describe()).save(args.readme_out)
        print(f"{args.readme_out}: weights/cifar10/samples.png beside 32 of these prompts")


def readme_picture(images: torch.Tensor, how: str, gap: int = 16) -> Image.Image:
    """weights/cifar10's grid (left) beside the 32 shortest prompts' images (right, 4 per row), each under a title."""
    short = sorted(sorted(range(len(PROMPTS)), key=lambda k: len(PROMPTS[k]))[:32])  # the 32 shortest, grid order
    rows = [[(PROMPTS[k], images[k]) for k in short[r * 4 : r * 4 + 4]] for r in range(8)]
    left = with_title(Image.open("weights/cifar10/samples.png").convert("RGB"), "weights/cifar10: a class in, an image out")
    right = with_title(tiles_image(rows, scale=2), f"weights/emoji: a prompt in ({how})")
    out = Image.new("RGB", (left.width + gap + right.width, max(left.height, right.height)), "white")
    out.paste(left, (0, 0))
    out.paste(right, (left.width + gap, 0))
    return out


if __name__ == "__main__":
    with torch.inference_mode():
        main()
