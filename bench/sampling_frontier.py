"""The quality-cost frontier of sampling: FID-N and seconds per image of each sampler and step count, and the knee.

    bash bench/sampling_frontier.sh cifar10                       # FID-N of every setting (guidance_table.py run)
    .venv/bin/python -m bench.sampling_frontier cost --model weights/cifar10    # seconds per image, side by side
    .venv/bin/python -m bench.sampling_frontier table --model weights/cifar10   # bench/sampling_frontier_cifar10.md

`cost` times every setting of the frontier in interleaved rounds (one round of warm-up, then the median of
`--rounds`), each at its own step count, with the app's default batch of 8 images, on all of this machine's
threads, and keeps the result as JSON beside the FID results. `table` joins the two and names the knee: the
cheapest setting whose FID is within FID's own noise of the best, where the noise is the gap between two draws of
the same setting (image k seeded k, and seeded 100000 + k). The knee is what the model folder ships
(`scheduler/` and `sampling.json`), so every front door samples with it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import time
from pathlib import Path

import torch

from bench.common import cpu_name, parse_setting
from denoiser.atomic import atomic_path
from denoiser.fast import malloc
from denoiser.folders.model_dir import load_model
from denoiser.sampling.loop import make_sampler, sample, spread_labels

NAMES = {"ddim": "DDIM", "dpmpp": "DPM-Solver++ (2M)", "unipc": "UniPC (bh2)"}
CLIP = "thresh-0.995-1"  # x0 clipped to [-1, 1] (diffusers' thresholding with sample_max_value 1), as DDIM's clip_sample
NOISE_OFFSET = 100000  # the second draw of the noise row: image k seeded 100000 + k
# the shipped default before the frontier, scored by `denoiser evaluate --fid` (the same images as the
# DDIM-50 setting here: classes spread, image k seeded k); kept in the model cards
EARLIER = {"cifar10": 48.20, "emoji": 120.15}
FRONTIER = re.compile(r"^(?:cfg-3\+)?sampler-(ddim|dpmpp|unipc)\+steps-(\d+)(\+" + re.escape(CLIP) + r")?$")


def num_samples(model: str) -> int:
    return 1000 if model == "cifar10" else 500


def setting_name(model: str, sampler: str, steps: int, clip: bool = False) -> str:
    """A frontier setting's name: the model's guidance (CFG 3 for cifar10, none for emoji), sampler, steps."""
    return f"{'cfg-3+' if model == 'cifar10' else ''}sampler-{sampler}+steps-{steps}{'+' + CLIP if clip else ''}"


def measured(model: str) -> list[dict]:
    """The frontier's scored settings (first draws), with DDIM-50 from the model card."""
    rows = []
    for f in sorted(runs_dir(model).glob(f"*-n{num_samples(model)}.json")):
        r = json.loads(f.read_text())
        m = FRONTIER.match(r["setting"])
        if m:
            rows.append({"setting": r["setting"], "sampler": m[1], "steps": int(m[2]), "clip": bool(m[3]),
                         "fid": r["fid"], "from": "run"})
    if not any((r["sampler"], r["steps"], r["clip"]) == ("ddim", 50, False) for r in rows):
        rows.append({"setting": setting_name(model, "ddim", 50), "sampler": "ddim", "steps": 50, "clip": False,
                     "fid": EARLIER[model], "from": "card"})
    return rows


def runs_dir(model: str) -> Path:
    return Path("runs/guidance") / model


def cost(args) -> None:
    """Seconds per image of each setting: interleaved rounds after a warm-up round, median."""
    malloc.configure()  # as the app and the command line run
    unet, sched = load_model(args.model)
    name = Path(args.model).name
    parsed = {r["setting"]: parse_setting(r["setting"], unet, sched) for r in measured(name)}
    labels = spread_labels(args.batch_size, unet.config.num_class_embeds)
    times: dict[str, list[float]] = {s: [] for s in parsed}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for s, st in parsed.items():
            scheduler = make_sampler(st.sampler, st.scheduler_config(sched.config))
            t0 = time.perf_counter()
            sample(unet, scheduler, args.batch_size, st.steps, seed=0, class_labels=labels, guidance=st.guidance)
            if round_:
                times[s].append((time.perf_counter() - t0) / args.batch_size)
        print(f"round {round_}/{args.rounds} done", flush=True)
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "batch_size": args.batch_size, "rounds": args.rounds,
              "seconds_per_image": {s: round(statistics.median(v), 4) for s, v in times.items()}}
    out = runs_dir(name) / "frontier-cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def _result(model: str, setting: str, n: int, offset: int = 0) -> dict | None:
    f = runs_dir(model) / f"{setting}{f'+seed-{offset}' if offset else ''}-n{n}.json"
    return json.loads(f.read_text()) if f.exists() else None


def knee(rows: list[dict], noise: float) -> dict:
    """The cheapest row whose FID is within `noise` of the best FID."""
    best = min(r["fid"] for r in rows)
    return min((r for r in rows if r["fid"] <= best + noise), key=lambda r: r["seconds"])


def table(args) -> None:
    name = Path(args.model).name
    n = num_samples(name)
    timing = json.loads((runs_dir(name) / "frontier-cost.json").read_text())
    rows = [dict(r, seconds=timing["seconds_per_image"][r["setting"]]) for r in measured(name)
            if r["setting"] in timing["seconds_per_image"]]
    noisy = setting_name(name, "ddim", 25)
    a, b = _result(name, noisy, n), _result(name, noisy, n, NOISE_OFFSET)
    if a is None or b is None:
        raise SystemExit(f"the noise row {noisy} needs both draws (offset 0 and {NOISE_OFFSET}); run them first")
    noise = abs(a["fid"] - b["fid"])
    chosen = knee(rows, noise)
    base = next((r["seconds"] for r in rows if (r["sampler"], r["steps"], r["clip"]) == ("ddim", 50, False)), None)
    guidance = "CFG 3, classes spread" if name == "cifar10" else "no guidance, classes spread"
    ref = f"bench/fid-reference/{'cifar10-val5000' if name == 'cifar10' else 'emoji32-val500'}.safetensors"
    label = lambda r: f"{NAMES[r['sampler']]}{', x0 clipped' if r['clip'] else ''}"  # noqa: E731
    lines = [f"## Sampling frontier of `{name}`: FID-{n} against seconds per image\n",
             f"{guidance}, trailing timesteps, image k seeded k, against the validation split (`{ref}`). "
             f"Time: {timing['cpu']}, {timing['threads']} threads, batch {timing['batch_size']}, median of "
             f"{timing['rounds']} interleaved rounds after a warm-up. FID's own noise: `{noisy}` scores "
             f"{a['fid']:.2f} with image k seeded k and {b['fid']:.2f} seeded {NOISE_OFFSET} + k, a gap of "
             f"**{noise:.2f}**. The knee, the cheapest setting within that gap of the best FID: "
             f"**{label(chosen)}, {chosen['steps']} steps**.\n",
             "| sampler | steps | FID | s per image | x DDIM-50 | command |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["sampler"] != "ddim", r["sampler"], r["clip"], r["steps"])):
        mark = "**" if r is chosen else ""
        rel = f"{r['seconds'] / base:.2f}" if base else ""
        cmd = (f"`denoiser evaluate --model weights/{name} --fid --num-samples {n} --reference {ref} --scheduler ddim "
               "--steps 50`" if r["from"] == "card" else
               f"`guidance_table.py run --model weights/{name} --num-samples {n} --settings {r['setting']}`")
        lines.append(f"| {mark}{label(r)}{mark} | {mark}{r['steps']}{mark} | {mark}{r['fid']:.2f}{mark} "
                     f"| {r['seconds']:.3f} | {rel} | {cmd} |")
    md = "\n".join(lines) + "\n"
    out = Path(f"bench/sampling_frontier_{name}.md")
    out.write_text(md)
    print(md)
    print(json.dumps({"knee": chosen, "noise": noise}))


def ship(args) -> None:
    """Write a setting into the model folder as its default: scheduler/ (the sampler on the folder's noise schedule
    and timestep spacing), model_index.json's scheduler class, sampling.json's step count and note."""
    folder = Path(args.model)
    _, sched = load_model(folder)
    extra = {"thresholding": True, "sample_max_value": 1.0} if args.clip else {}  # x0 clipped as DDIM's clip_sample
    scheduler = make_sampler(args.sampler, dict(sched.config, **extra))
    with atomic_path(folder / "scheduler") as tmp:  # a folder: written whole, then renamed over the old one
        scheduler.save_pretrained(tmp)
        old = folder / ".scheduler.old"
        (folder / "scheduler").replace(old)
    shutil.rmtree(old, ignore_errors=True)
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text())
    index["scheduler"] = ["diffusers", type(scheduler).__name__]
    sampling_file = folder / "sampling.json"
    sampling = json.loads(sampling_file.read_text()) if sampling_file.is_file() else {}
    sampling["num_inference_steps"] = args.steps
    sampling["note"] = args.note
    for path, value in ((index_file, index), (sampling_file, sampling)):
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(value, indent=1) + "\n")
    print(f"{folder}: {type(scheduler).__name__}, {args.steps} steps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--model", required=True)
    c.add_argument("--batch-size", type=int, default=8)
    c.add_argument("--rounds", type=int, default=3)
    t = sub.add_parser("table")
    t.add_argument("--model", required=True)
    w = sub.add_parser("ship")
    w.add_argument("--model", required=True)
    w.add_argument("--sampler", required=True)
    w.add_argument("--steps", type=int, required=True)
    w.add_argument("--clip", action="store_true", help="clip x0 to [-1, 1] (thresholding, sample_max_value 1)")
    w.add_argument("--note", required=True, help="what was measured (sampling.json's note)")
    args = p.parse_args()
    {"cost": cost, "table": table, "ship": ship}[args.command](args)


if __name__ == "__main__":
    main()
