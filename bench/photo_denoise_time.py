"""`denoiser denoise` of a phone-sized JPEG as a whole command, against the bare UNet time of its tiles (issue 58).

    .venv/bin/python -m bench.photo_denoise_time [--size 2000x1500] [--model cifar10]

Writes a 4:3 JPEG like a phone's (detailed, EXIF orientation 1), runs `denoiser denoise --model M --image it` as a
subprocess (its whole wall time: start-up, model load, decode, the precision check, the tiles, the PNG), checks the
result's size, then times the bare UNet on as many tiles as the command ran, in the same process-free way a user
would not: the loaded model, float32, eager, inference mode, NCHW, batches of tiles at the model's size, no cutting or
blending. The bare UNet runs at two batches, the tiles' own (TileOptions.batch_size) and 128, one after the other,
and the faster counts. Prints both and their ratio, and the CPU.

    .venv/bin/python -m bench.photo_denoise_time --tile-batches 32,128 [--size 1000x750] [--rounds 4]

instead times `denoise_photo` in this process at each tile batch (TileOptions.batch_size), interleaved round by round
after a warm-up, and prints the median and fastest of each.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.common import ROOT, cpu_name, interleaved, spread
from denoiser.folders.model_dir import load
from denoiser.restore.tiles import TileOptions, denoise_photo


def phone_jpeg(width: int, height: int) -> bytes:
    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (height // 8, width // 8, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC).save(buf, format="JPEG", quality=92)
    return buf.getvalue()


@torch.inference_mode()
def bare_unet_seconds(unet, tiles: int, batch: int) -> float:
    size = unet.config.sample_size
    x = torch.randn(batch, 3, size, size)  # (B, 3, S, S) NCHW, as a model comes from from_pretrained
    t = torch.full((batch,), 20)
    unet(x[:8], t[:8])  # warm-up
    start = time.perf_counter()
    done = 0
    while done < tiles:
        n = min(batch, tiles - done)
        unet(x[:n], t[:n])
        done += n
    return time.perf_counter() - start


def tile_batch_ab(model_dir: Path, width: int, height: int, batches: list[int], rounds: int) -> None:
    model = load(model_dir)
    photo = torch.from_numpy(np.array(Image.open(io.BytesIO(phone_jpeg(width, height))))).permute(2, 0, 1)  # (3, H, W)
    times = interleaved({b: partial(denoise_photo, model.unet, model.noise_schedule, photo, 0.1,
                                     options=TileOptions(batch_size=b)) for b in batches}, rounds)
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for b, ts in times.items():
        print(f"{width}x{height}, tiles batched {b}: {spread(ts)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="2000x1500")
    p.add_argument("--model", default="cifar10")
    p.add_argument("--tile-batches", default="", help="e.g. 32,128: time denoise_photo at each tile batch instead")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    if args.tile_batches:
        tile_batch_ab(ROOT / "weights" / args.model, w, h, [int(b) for b in args.tile_batches.split(",")], args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        photo, out = Path(tmp) / "phone.jpg", Path(tmp) / "out.png"
        photo.write_bytes(phone_jpeg(w, h))
        command = [str(ROOT / ".venv" / "bin" / "denoiser"), "denoise", "--model", args.model, "--image", str(photo),
                   "--out", str(out)]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                              cwd=ROOT, check=True)
        command_s = time.perf_counter() - start
        size = Image.open(out).size
    tiles = int(re.search(r"\((\d+) tiles\)", done.stdout).group(1))
    unet = load(ROOT / "weights" / args.model).unet
    bare = {batch: bare_unet_seconds(unet, tiles, batch) for batch in (TileOptions().batch_size, 128)}
    bare_batch = min(bare, key=bare.get)
    bare_s = bare[bare_batch]
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(done.stdout.strip().splitlines()[0])
    print(f"{args.size} JPEG -> {size[0]}x{size[1]} PNG; `denoiser denoise` as a whole command: {command_s:.1f} s; "
          f"the bare float32 eager UNet on its {tiles:,} tiles: {bare_s:.1f} s (batch {bare_batch}; "
          + ", ".join(f"batch {b}: {s:.1f} s" for b, s in bare.items())
          + f"); command / bare UNet: {command_s / bare_s:.2f}")


if __name__ == "__main__":
    main()
