"""Streaming shards (denoiser/data/stream.py) against the prepared store (denoiser/data/store.py), at 32x32.

    .venv/bin/python -m bench.data_stream --out /tmp/bench-shards --num 4000 --per-shard 500

Writes WebDataset shards of small generated JPEG photos (gradients under noise, 96x72, quality 90, a class name
each) under --out, then measures in one run, side by side:
  - stream start-up: opening the stream, i.e. indexing every shard's tar headers and label members (each process
    does it once at the start);
  - stream: one rank's steps of --batch images decoded at 32x32, with 0 DataLoader workers (decoded on the calling
    thread) and with 2, after one warm-up step, over --steps steps: images/s;
  - store, first run: preparing the store from the same shards (every image decoded once, 2 processes): images/s;
  - store, later runs: batches of --batch read from the prepared store (a memory-mapped gather, which is what a
    training step costs once the store exists): images/s.
Prints a markdown table and the CPU (lscpu: model, avx2 / avx512f / avx512_bf16 / amx flags).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np


def cpu_name() -> str:
    """The CPU's model name and the flags that matter here (lscpu), with the core count."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(info.get("Flags", "").split())
    has = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags] or ["none of avx2/avx512/amx"]
    return f"{info.get('Model name', '?').strip()} ({', '.join(has)}), {len(os.sched_getaffinity(0))} cores"


def write_shards(out: Path, num: int, per_shard: int) -> str:
    """`num` JPEGs in tar shards of `per_shard`, key.jpg + key.cls; returns the brace pattern."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:72, 0:96]
    shards = (num + per_shard - 1) // per_shard
    for s in range(shards):
        with tarfile.open(out / f"{s:05d}.tar", "w") as tar:
            for i in range(s * per_shard, min(num, (s + 1) * per_shard)):
                base = np.stack([xx * (i % 7 + 1), yy * (i % 5 + 1), xx + yy + 10 * i], -1) % 256  # (72, 96, 3)
                pixels = (base + rng.normal(0, 20, base.shape)).clip(0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
                for name, data in ((f"{i:07d}.jpg", buf.getvalue()), (f"{i:07d}.cls", f"class{i % 10}".encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(out / f"{{00000..{shards - 1:05d}}}.tar")


def stream_rate(pattern: str, size: int, batch: int, steps: int, workers: int) -> tuple[float, float]:
    """(seconds to open the stream, images/s over `steps` steps after a warm-up step) of one process."""
    from denoiser.data.stream import open_stream
    from denoiser.train.config import DataConfig

    cfg = DataConfig(dataset="webdataset", path=pattern, streaming=True, val_size=0)
    tic = time.perf_counter()
    stream = open_stream(cfg, size, seed=0, rank=0, world=1)
    opened = time.perf_counter() - tic
    batches = stream.batches(batch, workers)
    try:
        batches.get(0)  # warm-up: workers forked, first files opened
        tic = time.perf_counter()
        for step in range(1, steps + 1):
            batches.get(step)
        return opened, steps * batch / (time.perf_counter() - tic)
    finally:
        batches.close()


def store_rates(pattern: str, size: int, batch: int, steps: int) -> tuple[float, float]:
    """(images/s preparing the store with 2 processes, images/s reading batches from it) in a fresh cache."""
    import torch

    from denoiser.data.store import open_store, prepare_store
    from denoiser.data.webdataset import WebDatasetSource

    os.environ["DENOISER_CACHE"] = tempfile.mkdtemp(prefix="bench-stream-cache-")
    source = WebDatasetSource(pattern)
    tic = time.perf_counter()
    info = prepare_store(source, size, num_workers=2, progress=False)
    prepared = info.num_images / (time.perf_counter() - tic)
    ds = open_store(info.path)
    gen = torch.Generator().manual_seed(0)
    ds.batch(torch.randint(len(ds), (batch,), generator=gen))  # warm-up: pages mapped
    tic = time.perf_counter()
    for _ in range(steps):
        ds.batch(torch.randint(len(ds), (batch,), generator=gen))
    return prepared, steps * batch / (time.perf_counter() - tic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/bench-shards", help="folder for the generated shards")
    parser.add_argument("--num", type=int, default=4000, help="images to generate")
    parser.add_argument("--per-shard", type=int, default=500)
    parser.add_argument("--size", type=int, default=32, help="sample_size")
    parser.add_argument("--batch", type=int, default=64, help="images per step")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per stream row")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every row")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    shards = (args.num + args.per_shard - 1) // args.per_shard
    pattern = str(out / f"{{00000..{shards - 1:05d}}}.tar")
    if not (out / f"{shards - 1:05d}.tar").is_file():  # written once; later runs reuse them
        pattern = write_shards(out, args.num, args.per_shard)
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeats):  # interleaved, so a change in the machine's load hits every row alike
        for workers in (0, 2):
            opened, rate = stream_rate(pattern, args.size, args.batch, args.steps, workers)
            name = f"stream, {workers} DataLoader workers"
            runs.setdefault(name, []).append(rate)
            runs.setdefault(f"{name}: indexing the shards at start-up (samples/s)", []).append(args.num / opened)
        prepared, read = store_rates(pattern, args.size, args.batch, args.steps * 10)
        runs.setdefault("store, first run: preparing (2 processes, index included)", []).append(prepared)
        runs.setdefault("store, later runs: reading batches (memory-mapped gather)", []).append(read)
    rows = [(name, float(np.median(v)), " / ".join(f"{x:,.0f}" for x in v)) for name, v in runs.items()]
    print(f"CPU: {cpu_name()}; load average {os.getloadavg()[0]:.1f}")
    print(f"{args.num} generated 96x72 JPEGs in shards of {args.per_shard}, decoded to {args.size}x{args.size}, "
          f"steps of {args.batch} images\n")
    print(f"| data path | images/s, median of {args.repeats} | each run |\n|---|---|---|")
    for name, rate, each in rows:
        print(f"| {name} | {rate:,.0f} | {each} |")
    rate = dict((name, r) for name, r, _ in rows)
    print(f"\nstream with 2 workers / 0 workers: {rate['stream, 2 DataLoader workers'] / rate['stream, 0 DataLoader workers']:.2f}x; "
          f"store read / stream with 2 workers: "
          f"{rate['store, later runs: reading batches (memory-mapped gather)'] / rate['stream, 2 DataLoader workers']:.0f}x")


if __name__ == "__main__":
    main()
