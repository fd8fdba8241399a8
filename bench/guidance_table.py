"""What each guidance buys: FID-N of one model's DDIM-50 samples under classifier-free, perturbed-attention and
autoguidance, with the cost per image, on this machine.

    OMP_NUM_THREADS=1 .venv/bin/python bench/guidance_table.py run --model weights/cifar10 --num-samples 1000 \\
        --settings none cfg-2 pag-1 ag-2:GUIDE ...
    .venv/bin/python bench/guidance_table.py table --model weights/cifar10          # bench/guidance_<model>.md

A setting is NAME[-SCALE][:GUIDE][@LAYERS], joined with '+': `none`, `cfg-2`, `pag-1`, `pag-1@mid_attn,up.0.attn.0`,
`ag-2:/path/to/guide`, `uncond+pag-1` (no class labels: the model's "no class" row), `cfg-2+pag-1`. Every
setting samples the same N images (seed 0, DDIM-50, classes spread evenly as `denoiser evaluate --fid`
does) and is scored against the validation split's Inception statistics. Each result is kept as JSON
under runs/guidance/<model>/ (a finished setting is never redone), with the ms per image measured in the
same run (one thread) and the UNet passes per image.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from denoiser.fid import InceptionFeatures, Statistics, fid_of_images, spread_labels
from denoiser.guidance import Guidance, check_guide
from denoiser.pipeline import load_model
from denoiser.sample import make_sampler, sample

REFERENCES = {"cifar10": "bench/fid-reference/cifar10-val5000.safetensors", "emoji": "bench/fid-reference/emoji32-val500.safetensors"}


def cpu_name() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in flags.splitlines() if ln.startswith("model name")), platform.processor())
    has = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f" {f}" in flags]
    return f"{model} ({', '.join(has) or 'no AVX-512'})"


def parse_setting(text: str, unet, sched) -> tuple[Guidance, bool, float]:
    """(guidance, with class labels?, guide cost relative to the model) of a setting name."""
    scale, pag, layers, guide, guide_scale, labelled = 1.0, 0.0, None, None, 1.0, True
    for part in text.split("+"):
        part, _, where = part.partition("@")
        part, _, guide_dir = part.partition(":")
        kind, _, value = part.partition("-")
        if kind == "none":
            continue
        if kind == "uncond":
            labelled = False
        elif kind == "cfg":
            scale = float(value)
        elif kind == "pag":
            pag, layers = float(value), (tuple(where.split(",")) if where else None)
        elif kind == "ag":
            guide, guide_sched = load_model(guide_dir)
            check_guide(unet, sched.config, guide, guide_sched.config)
            guide_scale = float(value)
        else:
            raise ValueError(f"unknown setting part {part!r}; use none, uncond, cfg-W, pag-S[@layers], ag-W:GUIDE")
    cost = 0.0 if guide is None else sum(p.numel() for p in guide.parameters()) / sum(p.numel() for p in unet.parameters())
    return Guidance(scale, pag, layers, guide, guide_scale), labelled, cost


def run(args) -> None:
    torch.manual_seed(0)
    unet, sched = load_model(args.model)
    name = Path(args.model).name
    reference = Statistics.load(args.reference or REFERENCES[name])
    extractor = InceptionFeatures()
    out_dir = Path("runs/guidance") / name
    out_dir.mkdir(parents=True, exist_ok=True)
    for setting in args.settings:
        out = out_dir / f"{setting.replace('/', '_').replace(':', '=')}-n{args.num_samples}.json"
        if out.exists():
            print(f"{setting}: done before ({out})")
            continue
        guidance, labelled, guide_cost = parse_setting(setting, unet, sched)
        labels = spread_labels(args.num_samples, unet.config.num_class_embeds) if labelled else None
        images, seconds = [], 0.0
        for i, start in enumerate(range(0, args.num_samples, args.batch_size)):
            n = min(args.batch_size, args.num_samples - start)
            batch_labels = None if labels is None else labels[start : start + n]
            t0 = time.perf_counter()
            res = sample(unet, make_sampler("ddim", sched.config), n, args.steps, seed=i, class_labels=batch_labels,
                         guidance=guidance)
            seconds += time.perf_counter() - t0
            images.append(res.images.mul(255).round().to(torch.uint8))
            print(f"{setting}: {start + n}/{args.num_samples} images, {1000 * seconds / (start + n):.0f} ms/image", flush=True)
        images = torch.cat(images)
        torch.save(images[:100].clone(), out.with_suffix(".pt"))  # the first 100 images, for grids
        score = fid_of_images(images, reference, extractor)
        result = {"setting": setting, "describe": guidance.describe(), "fid": round(score, 2), "num_samples": args.num_samples,
                  "steps": args.steps, "labels": labelled, "unet_passes_per_step": guidance.main_passes + guide_cost,
                  "ms_per_image": round(1000 * seconds / args.num_samples, 1), "threads": torch.get_num_threads(),
                  "cpu": cpu_name(), "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                              text=True).stdout.strip()}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
        print(json.dumps(result), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--settings", nargs="+", required=True)
    r.add_argument("--num-samples", type=int, default=1000)
    r.add_argument("--steps", type=int, default=50)
    r.add_argument("--batch-size", type=int, default=64)
    r.add_argument("--reference", default=None)
    args = p.parse_args()
    run(args)


if __name__ == "__main__":
    main()
