"""Recipe table: short CIFAR-10 runs at equal wall-clock, scored by FID-N and bits/dim on the validation split.

    OMP_NUM_THREADS=1 .venv/bin/python bench/compare_recipes.py train --minutes 10    # one recipe after another
    OMP_NUM_THREADS=1 .venv/bin/python bench/compare_recipes.py score --num-samples 1000
    .venv/bin/python bench/compare_recipes.py table                                  # bench/recipe_table.md

Every recipe trains for the same wall-clock on one CPU thread (`OMP_NUM_THREADS=1`), one after another
on the same machine, from scratch, on the CIFAR-10 training JPEGs minus the 5,000-image validation split
(seed 0) whose Inception statistics are `bench/fid-reference/cifar10-val5000.safetensors`. The row
`diffusers train_unconditional` is the equal-compute comparison: diffusers' own recipe and `UNet2DModel`
(`bench/reference_recipe.py`). Each row changes one thing against `ours`, so the table says what each
change gives at this budget. Scores: FID-N of DDIM-50 samples (seed 0, classes spread evenly,
no guidance) and the variational bound in bits/dim on 200 validation images. A finished step is
never redone: `train` skips recipes whose model is exported, `score` keeps `score.json` per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

RUNS = Path("runs/recipes")
OUT = Path("bench/recipe_table.md")
READING = "## Reading the table"
GRIDS = Path("bench/recipes")
REFERENCE = "bench/fid-reference/cifar10-val5000.safetensors"
DATA = "../shared/data/cifar10-jpeg/train"
VAL_SIZE, VAL_SEED = 5000, 0


@dataclass(frozen=True)
class Recipe:
    name: str
    change: str  # what differs from `ours`, for the table
    overrides: tuple[str, ...] = ()  # --set key=value for `denoiser train`
    steps_per_minute: float = 200.0  # steps one thread of the bench CPU makes (~190 measured): sizes the cosine LR schedule
    batch_size: int = 16
    reference: bool = False  # diffusers' recipe (bench/reference_recipe.py) instead of ours
    config: str = "configs/cifar10-cpu.yaml"


RECIPES = (
    Recipe("ours", "configs/cifar10-cpu.yaml: 1.7M UNet, batch 16, lr 3e-4 cosine to 0, plain MSE, EMA 0.999, labels"),
    Recipe("diffusers", "diffusers train_unconditional: UNet2DModel 1.7M, lr 1e-4, EMA 0.9999, unconditional", reference=True),
    Recipe("v-prediction", "v-prediction instead of ε", ("diffusion.prediction_type=v_prediction",)),
    Recipe("min-snr-5", "min-SNR-γ 5 loss weighting", ("train.snr_gamma=5.0",)),
    Recipe("batch-64", "batch 64 (lr 5e-4, 50 warm-up steps): 4x fewer steps",
           ("train.lr=0.0005", "train.lr_warmup_steps=50"), steps_per_minute=60.0, batch_size=64),
    Recipe("ema-0.9999", "EMA max decay 0.9999 instead of 0.999 (the EMA warm-up keeps both at ~0.996 this early)",
           ("train.ema_max_decay=0.9999",)),
    Recipe("no-attention", "no attention blocks (ResBlocks and skips only): the seed's claim that attention helps, "
           "at equal wall-clock", ("model.attention_resolutions=[]", "model.mid_attention=false"), steps_per_minute=260.0),
)


def train_command(r: Recipe, minutes: float) -> list[str]:
    out = str(RUNS / r.name)
    if r.reference:
        return [sys.executable, "bench/reference_recipe.py", "--output-dir", out, "--minutes", str(minutes),
                "--val-size", str(VAL_SIZE), "--val-seed", str(VAL_SEED), "--data", DATA]
    sets = {"data.path": DATA, "data.val_size": VAL_SIZE, "data.val_seed": VAL_SEED,
            "train.batch_size": r.batch_size, "train.time_limit_minutes": minutes,
            "train.max_steps": max(100, int(r.steps_per_minute * minutes)),  # the cosine reaches ~0 at the time limit
            "train.sample_every": 10**9, "train.checkpoint_every": 10**9}
    cmd = ["denoiser", "train", "--config", r.config, "--output-dir", out]
    for kv in [f"{k}={v}" for k, v in sets.items()] + list(r.overrides):
        cmd += ["--set", kv]
    return cmd


def images_seen(run: Path) -> int:
    for name in ("train_summary.json", "summary.json"):
        if (run / name).exists():
            return int(json.loads((run / name).read_text())["images_seen"])
    raise FileNotFoundError(f"{run} has no train_summary.json / summary.json: train it first")


def cmd_train(args) -> None:
    if os.environ.get("OMP_NUM_THREADS") != "1":
        raise SystemExit("run with OMP_NUM_THREADS=1: every recipe gets the same single thread")
    for r in RECIPES:
        if args.only and r.name not in args.only:
            continue
        run = RUNS / r.name
        if (run / "model" / "model_index.json").exists():
            print(f"{r.name}: already trained ({run})", flush=True)
            continue
        cmd = train_command(r, args.minutes)
        print(f"{r.name}: {' '.join(cmd)}", flush=True)
        run.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(run.with_suffix(".log"), "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
        (run / "recipe.json").write_text(json.dumps({"command": cmd, "minutes": args.minutes,
                                                     "wall_s": round(time.monotonic() - started, 1)}, indent=1))


def cmd_score(args) -> None:
    from denoiser.data import load_datasets
    from denoiser.diffusion import Diffusion
    from denoiser.evaluate.fid import InceptionFeatures, Statistics, fid_of_images
    from denoiser.folders.model_dir import LoadedModel, load_model
    from denoiser.image_io import save_grid
    from denoiser.request import SPREAD, UNGUIDED, SampleRequest
    from denoiser.sampling.plan import resolve
    from denoiser.sampling.plan import run as run_plan
    from denoiser.train.config import DataConfig

    extractor = InceptionFeatures()
    ref = Statistics.load(REFERENCE)
    _, val = load_datasets(DataConfig(dataset="folder", path=DATA, val_size=VAL_SIZE, val_seed=VAL_SEED), 32)
    x, labels = val.batch(torch.arange(args.num_images))
    GRIDS.mkdir(parents=True, exist_ok=True)
    for r in RECIPES:
        run = RUNS / r.name
        done = run / f"score-{args.num_samples}.json"
        if done.exists() or not (run / "model" / "model_index.json").exists() or (args.only and r.name not in args.only):
            continue
        unet, sched = load_model(run / "model")
        cond = unet.config.get("num_class_embeds")
        request = SampleRequest(num_images=args.num_samples, classes=SPREAD if cond else None, seed=0, batch_size=100,
                                scheduler="ddim", steps=50, guidance=UNGUIDED)  # no guidance: the recipe's own model
        images = run_plan(resolve(request, LoadedModel.of(unet, sched)), progress=True).images.mul(255).round().to(torch.uint8)
        fid = fid_of_images(images, ref, extractor)
        grid = save_grid(images[:100], GRIDS / f"{r.name}.png", nrow=10, scale=2)
        bound = Diffusion(sched).evaluate(unet, x, labels if cond else None, batch_size=100, num_timesteps=50)
        score = {"fid": round(fid, 2), "num_samples": args.num_samples, "bits_per_dim": round(bound.bits_per_dim, 3),
                 "bpd_images": args.num_images, "images_seen": images_seen(run), "grid": str(grid),
                 "params_m": round(sum(p.numel() for p in unet.parameters()) / 1e6, 2)}
        done.write_text(json.dumps(score, indent=1))
        print(r.name, json.dumps(score), flush=True)


def cmd_table(args) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from profiling import cpu_name

    rows = [f"| recipe | what changes | params | images seen | FID-{args.num_samples} | bits/dim | samples |",
            "|---|---|---|---|---|---|---|"]
    for r in RECIPES:
        f = RUNS / r.name / f"score-{args.num_samples}.json"
        if not f.exists() or (args.only and r.name not in args.only):
            continue
        s = json.loads(f.read_text())
        rows.append(f"| {r.name} | {r.change} | {s['params_m']}M | {s['images_seen']:,} | **{s['fid']:.1f}** | "
                    f"{s['bits_per_dim']:.3f} | ![{r.name}](recipes/{r.name}.png) |")
    minutes = json.loads((RUNS / "ours" / "recipe.json").read_text())["minutes"]
    md = f"""## Recipe table: {minutes:g} minutes of one CPU thread each, scored by FID-{args.num_samples}

Machine: {cpu_name()}, torch {torch.__version__}; each recipe trained from scratch for {minutes:g} minutes on
one thread (`OMP_NUM_THREADS=1`), one after another, while another training run used the other core. Data:
CIFAR-10 training JPEGs minus the 5,000-image validation split (seed 0). FID-{args.num_samples}: DDIM-50, seed 0,
classes spread evenly, no guidance, against that split's Inception statistics ({REFERENCE}).
Bits/dim: variational bound on 200 validation images, 50 log-spaced timesteps. Grids: the first 100 FID
samples (columns are classes for the class-conditional models). Each recipe is one entry of `RECIPES` in
`bench/compare_recipes.py` (reproduce with its `train`, `score` and `table` subcommands).

{chr(10).join(rows)}
"""
    # what was learnt from a table is written by hand below READING; a new table keeps it
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""
    if READING in old:
        md += "\n" + READING + old.split(READING, 1)[1]
    out.write_text(md)
    print(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--minutes", type=float, default=10.0)
    t.add_argument("--only", nargs="*", help="recipe names (default: all)")
    s = sub.add_parser("score")
    s.add_argument("--num-samples", type=int, default=1000)
    s.add_argument("--num-images", type=int, default=200)
    s.add_argument("--only", nargs="*", help="recipe names (default: all trained)")
    tb = sub.add_parser("table")
    tb.add_argument("--num-samples", type=int, default=1000)
    tb.add_argument("--only", nargs="*", help="recipe names (default: every scored one)")
    tb.add_argument("--out", default=str(OUT), help="markdown file (default: %(default)s)")
    args = p.parse_args()
    {"train": cmd_train, "score": cmd_score, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
