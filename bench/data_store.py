"""The training data path: today's loader (commit d5fc9f3's denoiser/data.py: every process decodes every file,
one after another, into its own memory) against the prepared, memory-mapped store.

    .venv/bin/python -m bench.data_store startup --data ../shared/data/cifar10-jpeg/train --size 32
    .venv/bin/python -m bench.data_store photos --num 300 --out /tmp/bench-photos   # makes 12-megapixel JPEGs
    .venv/bin/python -m bench.data_store startup --data /tmp/bench-photos --size 64
    .venv/bin/python -m bench.data_store memory --sizes 1000 10000 50000
    .venv/bin/python -m bench.data_store prepare --data /tmp/bench-photos --size 64
    .venv/bin/python -m bench.data_store wait

startup: a fresh process per row; the clock starts after the imports and stops after the first optimizer
step of a small UNet on a batch of the data (so it counts listing, decoding or mapping, the split and one
step). "store, first run" starts with an empty cache ($DENOISER_CACHE points at a new folder), "second run"
finds the store. memory: a fresh process per row maps an N-image 64x64 store, takes one epoch of batches
(every image read once) and reports its resident memory: RssAnon is the process's own memory, RssFile the
store's pages, which live in the OS page cache and are shared by every process on the machine. "in memory"
is today's layout: one uint8 tensor of all images per process. prepare: images/s on one core, our decoder
against diffusers' train_unconditional data path (a `datasets` imagefolder with torchvision Resize,
CenterCrop, ToTensor, Normalize on every access), over one pass of the folder. wait: 2 CPU processes train a
few steps of a 32x32 and a 64x64 preset from their stores and report the fraction of time spent waiting for data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TODAY = "d5fc9f3"  # the commit whose denoiser/data.py is "today's loader"


def _old_data():
    """Today's loader, read from git: the module as it was, importable next to the new package."""
    import importlib.util

    src = subprocess.run(["git", "show", f"{TODAY}:denoiser/data.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_data.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_data", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_data"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _status(key: str) -> float:
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(key + ":"))
    return int(line.split()[1]) / 1024  # MiB


def child_startup(args) -> None:
    import torch

    from denoiser.diffusion import Diffusion
    from denoiser.model.unet import UNet
    from denoiser.train.config import DataConfig

    loader = _old_data().load_datasets if args.loader == "today" else __import__("denoiser.data").data.load_datasets
    imported = time.perf_counter()
    cfg = DataConfig(dataset="folder", path=args.data, val_size=100)
    train, _ = loader(cfg, args.size)
    data_ready = time.perf_counter()
    torch.manual_seed(0)
    unet = UNet(sample_size=args.size, base_channels=32, channel_mult=(1, 2), layers_per_block=1,
                attention_resolutions=(), num_heads=1, norm_num_groups=8)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    diffusion = Diffusion.from_config(__import__("denoiser.diffusion").diffusion.DiffusionConfig())
    x, _ = train.batch(torch.randperm(len(train))[:16])
    diffusion.training_loss(unet, x, None).backward()
    opt.step()
    done = time.perf_counter()
    print(json.dumps({"data_s": round(data_ready - imported, 2), "first_step_s": round(done - imported, 2),
                      "images": len(train), "rss_anon_mb": round(_status("RssAnon"))}))


def _run_child(argv: list[str], env: dict | None = None) -> dict:
    res = subprocess.run([sys.executable, "-m", "bench.data_store", *argv], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, **(env or {})})
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def startup(args) -> list[str]:
    cache = tempfile.mkdtemp(prefix="bench-cache-")
    rows = ["| loader | data ready (s) | first optimizer step (s) | images | RssAnon (MiB) |", "|---|---|---|---|---|"]
    for name, loader, env in (("today", "today", {}), ("store, first run", "store", {"DENOISER_CACHE": cache}),
                              ("store, second run", "store", {"DENOISER_CACHE": cache})):
        r = _run_child(["_startup", "--loader", loader, "--data", args.data, "--size", str(args.size)], env)
        rows.append(f"| {name} | {r['data_s']} | {r['first_step_s']} | {r['images']} | {r['rss_anon_mb']} |")
        print(rows[-1], flush=True)
    return rows


class RandomSource:
    """N random 64x64 images, as a store source (fast to prepare: the memory measurement needs no decoding)."""

    name, parallel = "random", False

    def __init__(self, n: int):
        self.n, self.classes = n, []

    def __len__(self) -> int:
        return self.n

    def fingerprint(self) -> str:
        return f"random-{self.n}"

    def read(self, start: int, stop: int, size: int):
        import numpy as np

        from denoiser.data.sources import Chunk

        rng = np.random.default_rng(start)
        return Chunk(rng.integers(0, 256, (stop - start, 3, size, size), dtype=np.uint8), np.zeros(stop - start, dtype=np.int64))


def child_memory(args) -> None:
    import torch

    from denoiser.data import open_store, split
    from denoiser.data.store import prepare_store

    before = _status("RssAnon")
    if args.loader == "in-memory":  # today's layout: every image in one uint8 tensor of this process
        images = torch.empty(args.n, 3, 64, 64, dtype=torch.uint8).random_(0, 256)  # filled in place, as today
        ds = __import__("denoiser.data").data.ImageDataset(images, torch.zeros(args.n, dtype=torch.long), [])
    else:
        ds = open_store(prepare_store(RandomSource(args.n), 64, progress=False).path)
    train, _ = split(ds, 100, 0)
    perm = torch.randperm(len(train))
    for s in range(0, len(train) - 63, 64):
        train.batch(perm[s : s + 64])
    print(json.dumps({"rss_anon_mb": round(_status("RssAnon") - before), "rss_file_mb": round(_status("RssFile")),
                      "vm_rss_mb": round(_status("VmRSS"))}))


def memory(args) -> list[str]:
    cache = tempfile.mkdtemp(prefix="bench-cache-")
    rows = ["| images (64x64) | layout | own memory growth, RssAnon (MiB) | store pages, RssFile (MiB, shared) |", "|---|---|---|---|"]
    os.environ["DENOISER_CACHE"] = cache
    from denoiser.data.store import prepare_store

    for n in args.sizes:
        prepare_store(RandomSource(n), 64, progress=False)  # here: the child only maps it
        for loader in ("in-memory", "store"):
            r = _run_child(["_memory", "--loader", loader, "--n", str(n)], {"DENOISER_CACHE": cache})
            rows.append(f"| {n} | {loader} | {r['rss_anon_mb']} | {r['rss_file_mb']} |")
            print(rows[-1], flush=True)
    return rows


def make_photos(args) -> None:
    """`--num` 12-megapixel (4000x3000) JPEGs, smooth colour fields with sensor-like noise, quality 90."""
    import concurrent.futures

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ProcessPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        list(pool.map(_photo, [(out, i) for i in range(args.num)]))
    print(f"{args.num} photos in {out}")


def _photo(task) -> None:
    import numpy as np
    from PIL import Image

    out, i = task
    rng = np.random.default_rng(i)
    base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((4000, 3000), Image.Resampling.BICUBIC)
    noise = rng.integers(-12, 13, (3000, 4000, 1), dtype=np.int16)
    arr = (np.asarray(base, dtype=np.int16) + noise).clip(0, 255).astype(np.uint8)
    Image.fromarray(arr).save(out / f"IMG_{i:05d}.jpg", quality=90)


def prepare_rate(args) -> list[str]:
    import datasets
    import torch
    from torchvision import transforms

    from denoiser.data.sources import list_folder

    source = list_folder(args.data)
    n = len(source)
    tic = time.perf_counter()
    source.read(0, n, args.size)
    ours = n / (time.perf_counter() - tic)
    cache = tempfile.mkdtemp(prefix="bench-hf-")
    tic = time.perf_counter()
    ds = datasets.load_dataset("imagefolder", data_dir=args.data, split="train", cache_dir=cache)
    tf = transforms.Compose([transforms.Resize(args.size, interpolation=transforms.InterpolationMode.BILINEAR),
                             transforms.CenterCrop(args.size), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize([0.5], [0.5])])
    ds.set_transform(lambda b: {"input": [tf(im.convert("RGB")) for im in b["image"]]})
    loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=0)
    for _ in loader:
        pass
    theirs = n / (time.perf_counter() - tic)
    rows = ["| data path (one core) | images/s | ratio |", "|---|---|---|",
            f"| denoiser store preparation (draft decode, once) | {ours:.1f} | {ours / theirs:.2f}x |",
            f"| diffusers train_unconditional (imagefolder + torchvision, every epoch) | {theirs:.1f} | 1.00x |"]
    print("\n".join(rows))
    return rows


def data_wait(args) -> list[str]:
    """2 CPU processes (gloo) train a few steps from the store; train_summary.json's data_wait is the fraction of
    the main process's loop time spent waiting for its batch (the first steps' warm-up included)."""
    import yaml

    rows = ["| config | size | global batch | steps | data wait | images/s |", "|---|---|---|---|---|---|"]
    for config, batch, steps in (("cifar10-cpu", 16, 40), ("emoji", 32, 12)):
        out = Path(tempfile.mkdtemp(prefix="bench-wait-"))
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
               "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "denoiser.train.command", "--config", config,
               "--output-dir", str(out), "--max-steps", str(steps), "--set", f"train.batch_size={batch}",
               "--set", "train.sample_every=0", "--set", f"train.checkpoint_every={steps}", "--set", "train.ema=false"]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "ACCELERATE_USE_CPU": "true",
                                                                                 "OMP_NUM_THREADS": "1"})
        if res.returncode:
            raise RuntimeError(res.stderr[-3000:])
        summary = json.loads((out / "train_summary.json").read_text())
        size = yaml.safe_load((out / "config.yaml").read_text())["model"]["sample_size"]
        rows.append(f"| {config} | {size} | {batch} | {steps} | {summary['data_wait']:.2%} | {summary['images_per_s']} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["startup", "memory", "photos", "prepare", "wait", "_startup", "_memory"])
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg/train"))
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--loader", default="store")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    p.add_argument("--num", type=int, default=300)
    p.add_argument("--out", default="/tmp/bench-photos")
    args = p.parse_args()
    if args.what in ("_startup", "_memory"):
        (child_startup if args.what == "_startup" else child_memory)(args)
        return
    if args.what == "photos":
        return make_photos(args)
    from bench.common import cpu_name

    print(f"# {args.what} on {cpu_name()}, {len(os.sched_getaffinity(0))} cores")
    {"startup": startup, "memory": memory, "prepare": prepare_rate, "wait": data_wait}[args.what](args)


if __name__ == "__main__":
    main()
