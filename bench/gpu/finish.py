"""After a GPU run: the model in fp16, samples for FID, one tar to bring back.

    python3 bench/gpu/finish.py RUN_DIR NAME OUT_DIR NUM_FID_SAMPLES [DEFAULTS_DIR]

Writes OUT_DIR/NAME.tar (the fp16 model folder, the run's config, loss log, summary and sample
grids) and the samples for FID, uint8 (N, H, W, 3), DDIM-50, classes spread evenly, image k seeded k
(denoiser.request's seed rule; the seeds and classes of bench/guidance_table.py's CPU runs):
OUT_DIR/NAME-samples.npy without guidance and, where DEFAULTS_DIR (the shipped model folder, e.g.
weights/cifar10) has a sampling.json, OUT_DIR/NAME-samples-default.npy with its guidance (the setting
the README's FID target is measured with). Scored on a CPU later: denoiser evaluate --fid --samples.
"""

from __future__ import annotations

import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch

from denoiser.model_dir import load_model
from denoiser.pipeline import save_pipeline
from denoiser.request import SPREAD, SampleRequest
from denoiser.sampling import SAMPLING_FILE, resolve, run

BATCH = 64  # images per UNet batch: speed only (image k is seeded k whatever its batch)


def main(run_folder: str, name: str, out: str, num_samples: str, defaults_dir: str | None = None) -> None:
    run_dir, out_dir = Path(run_folder), Path(out)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    unet, sched = load_model(run_dir / "model", device=device)
    save_pipeline(unet, sched, run_dir / "model-fp16", dtype=torch.float16)
    classes = SPREAD if unet.config.num_class_embeds else None
    request = SampleRequest(num_images=int(num_samples), classes=classes, seed=0, batch_size=BATCH, scheduler="ddim",
                            steps=50)
    off = SampleRequest(**{**vars(request), "guidance_scale": 1.0, "pag_scale": 0.0, "guide_scale": 1.0})
    plans = {"samples": resolve(off, unet=unet, scheduler=sched)}
    if defaults_dir and (Path(defaults_dir) / SAMPLING_FILE).is_file():  # the folder's guidance, on this run's model
        plans["samples-default"] = resolve(request, defaults_dir, unet=unet, scheduler=sched)
    for suffix, plan in plans.items():
        tic = time.perf_counter()
        images = run(plan).images.mul(255).round().to(torch.uint8)
        dt = time.perf_counter() - tic
        print(f"{name}: {len(images)} samples ({plan.describe()}) in {dt:.1f} s ({len(images) / dt:.0f} img/s)")
        np.save(out_dir / f"{name}-{suffix}.npy", images.permute(0, 2, 3, 1).numpy())  # (N, C, H, W) -> (N, H, W, C)
    with tarfile.open(out_dir / f"{name}.tar", "w") as tar:
        tar.add(run_dir / "model-fp16", arcname="model")
        for extra in ("config.yaml", "loss.csv", "train_summary.json", "loss.png", "run_info.json", "samples"):
            if (run_dir / extra).exists():
                tar.add(run_dir / extra, arcname=extra)


if __name__ == "__main__":
    main(*sys.argv[1:])
