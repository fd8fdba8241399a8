"""What each guidance buys: FID-N of one model's DDIM-50 samples under classifier-free, perturbed-attention and
autoguidance, with the cost per image, on this machine.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.guidance_table run --model weights/cifar10 --num-samples 1000 \\
        --settings none cfg-2 pag-1 ag-2:GUIDE ...
    .venv/bin/python -m bench.guidance_table table --model weights/cifar10          # bench/guidance_<model>.md

A setting is NAME[-SCALE][:GUIDE][@LAYERS], joined with '+': `none`, `cfg-2`, `pag-1`, `pag-1@mid_attn,up.0.attn.0`,
`ag-2:/path/to/guide`, `uncond+pag-1` (no class labels: the model's "no class" row), `cfg-2+pag-1`, `cfg-4+int-70-550`
(guidance only at timesteps 70..550), `cfg-3+spacing-trailing` (the sampler's timestep spacing), `cfg-3+eta-0.3`
(DDIM's stochasticity), `cfg-4+thresh-0.995-1.5` (diffusers' dynamic thresholding of x0: ratio, max), and the
ablations `off@mid_attn` / `off@all` (those layers switched to identity attention for the whole run). Every
setting samples the same N images (seed 0, DDIM-50, classes spread evenly as `denoiser evaluate --fid`
does) and is scored against the validation split's Inception statistics. Each result is kept as JSON
under runs/guidance/<model>/ (a finished setting is never redone), with the ms per image measured in the
same run (one thread) and the UNet passes per image.
"""

from __future__ import annotations

import argparse
import glob
import json
import subprocess
import time
from pathlib import Path

import torch

from bench.common import Setting, cpu_name, parse_setting
from denoiser.evaluate.fid import InceptionFeatures, Statistics, fid_of_images
from denoiser.folders.model_dir import load_model
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import make_sampler, sample, spread_labels
from denoiser.sampling.plan import Plan
from denoiser.sampling.plan import run as run_plan

SEED_RULE = "image k seeded k"  # denoiser.request's rule; results without it drew batch i of 64 from seed i
REFERENCES = {"cifar10": "bench/fid-reference/cifar10-val5000.safetensors", "emoji": "bench/fid-reference/emoji32-val500.safetensors"}


def passes_per_step(guidance: Guidance, guide_cost: float, scheduler_config, steps: int, sampler: str = "ddim") -> float:
    """UNet passes per step over the sampler's timesteps at `steps` (`Guidance.passes_per_step`)."""
    sched = make_sampler(sampler, scheduler_config)
    sched.set_timesteps(steps)
    return guidance.passes_per_step(sched.timesteps, guide_cost)


def generate(unet, setting: Setting, config: dict, num_images: int, steps: int, batch_size: int,
             batches: list[int] | None, seed: int = 0) -> torch.Tensor:
    """A setting's samples as uint8 (N, 3, H, W), classes spread evenly, image k seeded k (the seed rule of
    denoiser.request) from `seed`; batches: only these batch indices (one shard of the run)."""
    labels = spread_labels(num_images, unet.config.num_class_embeds) if setting.labelled else None
    plan = Plan(unet, make_sampler(setting.sampler, config), steps, setting.eta, setting.guidance, labels, seed, num_images, batch_size)
    indices = None if batches is None else [k for i in batches for k in range(i * batch_size, min(num_images, (i + 1) * batch_size))]
    return run_plan(plan, indices=indices, progress=True).images.mul(255).round().to(torch.uint8)


def shard_batches(shard: str | None, num_samples: int, batch_size: int) -> list[int] | None:
    """Shard "K/N": the batch indices K, K+N, ... this process makes (None: all)."""
    if not shard:
        return None
    k, n = (int(v) for v in shard.split("/"))
    if not 0 <= k < n:
        raise SystemExit(f"--shard K/N needs 0 <= K < N, got {shard}")
    return list(range(k, -(-num_samples // batch_size), n))


def gather_shards(out: Path, shard: str, batches: list[int], images: torch.Tensor, seconds: float, batch_size: int):
    """Keep this shard's images by batch; once every shard of the run is kept, (all images in batch order, the
    shards' summed seconds), else None."""
    k, n = (int(v) for v in shard.split("/"))
    part = lambda j: out.with_name(f"{out.stem}.shard{j}of{n}.pt")  # noqa: E731
    mine = {i: images[j * batch_size : (j + 1) * batch_size].clone() for j, i in enumerate(batches)}
    tmp = part(k).with_suffix(".tmp")
    torch.save({"images": mine, "seconds": seconds}, tmp)
    tmp.replace(part(k))
    if not all(part(j).exists() for j in range(n)):
        return None
    kept = [torch.load(part(j), weights_only=True) for j in range(n)]
    by_batch = {i: x for d in kept for i, x in d["images"].items()}
    return torch.cat([by_batch[i] for i in sorted(by_batch)]), sum(d["seconds"] for d in kept)


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
        parsed = parse_setting(setting, unet, sched)
        guidance, labelled, eta = parsed.guidance, parsed.labelled, parsed.eta
        config = parsed.scheduler_config(sched.config)
        batches = shard_batches(args.shard, args.num_samples, args.batch_size)
        steps = parsed.steps or args.steps
        t0 = time.perf_counter()
        with parsed.switched_off(unet):
            images = generate(unet, parsed, config, args.num_samples, steps, args.batch_size, batches, parsed.seed)
        seconds = time.perf_counter() - t0
        if args.shard:
            gathered = gather_shards(out, args.shard, batches, images, seconds, args.batch_size)
            if gathered is None:
                print(f"{setting}: shard {args.shard} done; the last shard to finish scores the run", flush=True)
                continue
            images, seconds = gathered
        torch.save(images[:100].clone(), out.with_suffix(".pt"))  # the first 100 images, for grids
        score = fid_of_images(images, reference, extractor)
        result = {"setting": setting, "describe": guidance.describe(), "fid": round(score, 2), "num_samples": args.num_samples,
                  "seed_rule": SEED_RULE,
                  "sampler": parsed.sampler, "steps": steps, "seed_offset": parsed.seed, "timestep_spacing": config.get("timestep_spacing", "leading"), "labels": labelled,
                  "eta": eta, "thresholding": [config["dynamic_thresholding_ratio"], config["sample_max_value"]]
                  if config.get("thresholding") else None,
                  "unet_passes_per_step": round(passes_per_step(guidance, parsed.guide_cost, config, steps, parsed.sampler), 2),
                  "ms_per_image": round(1000 * seconds / args.num_samples, 1), "threads": torch.get_num_threads(),
                  "cpu": cpu_name(), "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                              text=True).stdout.strip()}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
        print(json.dumps(result), flush=True)


def short(setting: str) -> str:
    """A setting's name for tables: layer lists with one prefix as `prefix*`, guide folders by their name."""
    parts = []
    for part in setting.split("+"):
        part, at, where = part.partition("@")
        part, colon, guide = part.partition(":")
        layers = where.split(",")
        if len(layers) > 1 and len({n.rsplit(".", 1)[0] for n in layers}) == 1:
            where = layers[0].rsplit(".", 1)[0] + ".*"
        parts.append(part + (colon + Path(guide).name if colon else "") + (at + where if at else ""))
    return "+".join(parts)


def table(args) -> None:
    """bench/guidance_<model>.md from the kept results, and docs/guidance-<model>.png: the same seeds per setting."""
    from PIL import Image, ImageDraw

    from denoiser.image_io import to_pil

    name = Path(args.model).name
    results = [json.loads(f.read_text()) for f in sorted((Path("runs/guidance") / name).glob("*.json"))]
    if not results:
        raise SystemExit(f"no results under runs/guidance/{name}: run first")
    lines = ["| setting | what | N | FID-N | UNet passes per step |", "|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (-r["num_samples"], r["fid"])):
        spacing = r.get("timestep_spacing") or next(  # results before session 16 name it only in the setting
            (p.split("-", 1)[1] for p in r["setting"].split("+") if p.startswith("spacing-")), None)
        what = r["describe"] + ("" if r["labels"] else ", no class labels") + (f", {spacing} timesteps" if spacing else "")
        what += (f", DDIM eta {r['eta']:g}" if r.get("eta") else "") + (
            ", dynamic thresholding (ratio {:g}, max {:g})".format(*r["thresholding"]) if r.get("thresholding") else "")
        what += "" if r.get("seed_rule") == SEED_RULE else " (†)"
        lines.append(f"| `{short(r['setting'])}` | {what} | {r['num_samples']} | **{r['fid']:.2f}** "
                     f"| {r['unet_passes_per_step']:.2f} |")
    cpus = sorted({r["cpu"] for r in results})
    md = (f"## Guidance on `{name}`: FID-N of DDIM-50 samples\n\n"
          f"Same seeds for every setting (image k seeded k; † rows were sampled before that rule, batch i of 64 seeded "
          f"i: the same settings, other draws), classes spread evenly (0, 1, ..., K-1, 0, ...), "
          f"against {REFERENCES.get(name, 'the validation split')}. Sampled on one thread: {'; '.join(cpus)}; "
          f"the cost of each setting: `guidance_table.py cost` (interleaved, median; bench/guidance_cifar10.md). Reproduce: `OMP_NUM_THREADS=1 python -m bench.guidance_table run --model weights/{name} "
          f"--num-samples N --settings SETTING ...`, then `table`.\n\n" + "\n".join(lines) + "\n")
    out = Path(f"bench/guidance_{name}.md")
    keep = out.read_text().split(READING, 1)[1] if out.exists() and READING in out.read_text() else ""
    out.write_text(md + (f"\n{READING}{keep}" if keep else ""))
    print(md)
    order = args.grid or [r["setting"] for r in results]
    largest = {}  # one tile per setting (the same seeds at every N): its largest run's FID
    for r in results:
        if r["setting"] in order and r["num_samples"] > largest.get(r["setting"], {"num_samples": 0})["num_samples"]:
            largest[r["setting"]] = r
    shown = sorted(largest.values(), key=lambda r: order.index(r["setting"]))
    tiles = []
    for r in shown:
        stem = r["setting"].replace("/", "_").replace(":", "=")
        kept = sorted((Path("runs/guidance") / name).glob(f"{glob.escape(stem)}-n*.pt"))  # any N: the same first images
        if kept:
            f = kept[0]
            grid = to_pil(torch.load(f, weights_only=True)[: args.grid_images].float() / 255, nrow=10)
            tiles.append((f"{short(r['setting'])}: FID-{r['num_samples']} {r['fid']:.1f}", grid.resize((grid.width * 2, grid.height * 2), Image.Resampling.NEAREST)))
    if tiles:
        w, h = tiles[0][1].size
        cols = min(3, len(tiles))
        sheet = Image.new("RGB", (cols * (w + 10), ((len(tiles) + cols - 1) // cols) * (h + 24)), "white")
        draw = ImageDraw.Draw(sheet)
        for i, (label, img) in enumerate(tiles):
            x, y = (i % cols) * (w + 10), (i // cols) * (h + 24)
            draw.text((x + 2, y + 4), label, fill="black")
            sheet.paste(img, (x, y + 20))
        sheet.save(f"docs/guidance-{name}.png")
        print(f"grids: docs/guidance-{name}.png")


READING = "## Reading the table"


def cost(args) -> None:
    """ms per image of each setting, interleaved rounds after a warm-up, median: the cost column measured quietly."""
    import statistics

    unet, sched = load_model(args.model)
    settings = {s: parse_setting(s, unet, sched) for s in args.settings}
    labels = spread_labels(args.batch_size, unet.config.num_class_embeds)
    times: dict[str, list[float]] = {s: [] for s in settings}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, st in settings.items():
            scheduler = make_sampler(st.sampler, st.scheduler_config(sched.config))  # its spacing and thresholding too
            t0 = time.perf_counter()
            with st.switched_off(unet):
                sample(unet, scheduler, args.batch_size, args.steps, seed=0, eta=st.eta,
                       class_labels=labels if st.labelled else None, guidance=st.guidance)
            if round_:
                times[name].append(1000 * (time.perf_counter() - t0) / args.batch_size * 50 / args.steps)
    base = statistics.median(times[args.settings[0]])
    print(f"ms per image at 50 steps, batch {args.batch_size}, {torch.get_num_threads()} thread(s), median of {args.rounds} "
          f"interleaved rounds; {cpu_name()}")
    print("| setting | UNet passes per step | ms per image | x first |\n|---|---|---|---|")
    for name, st in settings.items():
        med = statistics.median(times[name])
        passes = passes_per_step(st.guidance, st.guide_cost, st.scheduler_config(sched.config), 50)
        print(f"| `{short(name)}` | {passes:.2f} | {med:.0f} | {med / base:.2f} |")


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
    r.add_argument("--shard", default=None, metavar="K/N",
                   help="make batches K, K+N, ... only (N processes share one run; the last to finish scores it)")
    t = sub.add_parser("table")
    t.add_argument("--model", required=True)
    t.add_argument("--grid", nargs="*", help="settings drawn side by side (default: all)")
    t.add_argument("--grid-images", type=int, default=30, help="images per setting (columns are classes)")
    c = sub.add_parser("cost")
    c.add_argument("--model", required=True)
    c.add_argument("--settings", nargs="+", required=True)
    c.add_argument("--batch-size", type=int, default=16)
    c.add_argument("--steps", type=int, default=10)
    c.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    {"run": run, "table": table, "cost": cost}[args.command](args)


if __name__ == "__main__":
    main()
