"""`denoiser denoise` of a phone-sized JPEG as a whole command, against the bare UNet time of its tiles (issue 58).

    .venv/bin/python bench/photo_denoise_time.py [--size 2000x1500] [--model cifar10]

Writes a 4:3 JPEG like a phone's (detailed, EXIF orientation 1), runs `denoiser denoise --model M --image it` as a
subprocess (its whole wall time: start-up, model load, decode, the precision check, the tiles, the PNG), checks the
result's size, then times the bare UNet on as many tiles as the command ran, in the same process-free way a user
would not: the loaded model, float32, eager, inference mode, batches of 128 tiles at the model's size (the tiles'
batch), no cutting or blending. Prints both and their ratio, and the CPU.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from profiling import cpu_name

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from denoiser.folders.model_dir import load  # noqa: E402


def phone_jpeg(width: int, height: int) -> bytes:
    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (height // 8, width // 8, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC).save(buf, format="JPEG", quality=92)
    return buf.getvalue()


def bare_unet_seconds(model_dir: Path, tiles: int, batch: int = 128) -> float:
    model = load(model_dir)
    unet, size = model.unet, model.unet.config.sample_size
    x = torch.randn(batch, 3, size, size).contiguous(memory_format=torch.channels_last)
    t = torch.full((batch,), 20)
    with torch.inference_mode():
        unet(x[:8], t[:8])  # warm-up
        start = time.perf_counter()
        done = 0
        while done < tiles:
            n = min(batch, tiles - done)
            unet(x[:n], t[:n])
            done += n
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="2000x1500")
    p.add_argument("--model", default="cifar10")
    args = p.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
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
    bare_s = bare_unet_seconds(ROOT / "weights" / args.model, tiles)
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(done.stdout.strip().splitlines()[0])
    print(f"{args.size} JPEG -> {size[0]}x{size[1]} PNG; `denoiser denoise` as a whole command: {command_s:.1f} s; "
          f"the bare float32 eager UNet on its {tiles:,} tiles: {bare_s:.1f} s; command / bare UNet: "
          f"{command_s / bare_s:.2f}")


if __name__ == "__main__":
    main()
