"""After a GPU run: the model in fp16, samples for FID, one tar to bring back.

    python3 bench/gpu/finish.py RUN_DIR NAME OUT_DIR NUM_FID_SAMPLES

Writes OUT_DIR/NAME.tar (the fp16 model folder, the run's config, loss log, summary and sample
grids) and OUT_DIR/NAME-samples.npy (uint8 (N, H, W, 3), DDIM-50, seed 0, classes spread evenly),
scored by FID on a CPU later (denoiser evaluate --fid --samples).
"""

from __future__ import annotations

import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch

from denoiser.fid import generate_images
from denoiser.model_dir import load_model
from denoiser.pipeline import save_pipeline


def main(run: str, name: str, out: str, num_samples: str) -> None:
    run_dir, out_dir = Path(run), Path(out)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    unet, sched = load_model(run_dir / "model", device=device)
    save_pipeline(unet, sched, run_dir / "model-fp16", dtype=torch.float16)
    tic = time.perf_counter()
    images = generate_images(unet, sched.config, int(num_samples), steps=50, seed=0, batch_size=500)
    dt = time.perf_counter() - tic
    print(f"{name}: {len(images)} DDIM-50 samples in {dt:.1f} s ({len(images) / dt:.0f} img/s)")
    np.save(out_dir / f"{name}-samples.npy", images.permute(0, 2, 3, 1).numpy())  # (N, C, H, W) -> (N, H, W, C)
    with tarfile.open(out_dir / f"{name}.tar", "w") as tar:
        tar.add(run_dir / "model-fp16", arcname="model")
        for extra in ("config.yaml", "loss.csv", "train_summary.json", "loss.png", "run_info.json", "samples"):
            if (run_dir / extra).exists():
                tar.add(run_dir / extra, arcname=extra)


if __name__ == "__main__":
    main(*sys.argv[1:])
